// GGUF model files (versions 2 and 3, little-endian): metadata, tensor infos, and dequantization
// of the ggml block formats to float. The file is memory-mapped read-only; metadata strings and
// tensor data are views into the mapping, which lives as long as any copy of the GgufFile.
// Spec: ggml's docs/gguf.md; block layouts: ggml-common.h (block_q4_0 ... block_q6_K).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvq::gguf {

/// \brief Metadata value types, numbered as in the file.
enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

/// \brief "uint32", "string", ...; "type N" for a number outside the enum.
std::string value_type_name(ValueType t);

/// \brief One metadata value. Scalars keep their raw little-endian bits; arrays keep numeric
/// elements as a byte view (no per-element allocation), strings and nested arrays as lists.
struct Value {
  ValueType type = ValueType::kUint8;
  uint64_t bits = 0;     ///< scalar types: the raw bits, zero-extended
  std::string_view str;  ///< kString: the bytes (not NUL-terminated)
  // kArray only:
  ValueType elem_type = ValueType::kUint8;
  uint64_t count = 0;                     ///< number of elements
  std::string_view raw;                   ///< numeric / bool elements: count * size bytes
  std::vector<std::string_view> strings;  ///< elem_type == kString
  std::vector<Value> arrays;              ///< elem_type == kArray
};

/// \brief ggml tensor types, numbered as in ggml.h (gaps are retired types).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kNVFP4 = 40,
  kQ1_0 = 41,
};

/// \brief Size of one ggml block: `block_elems` values stored in `block_bytes` bytes.
struct TypeTraits {
  const char* name;     ///< "Q4_1", as ggml prints it
  int64_t block_elems;  ///< 1 for plain types, 32 or 256 for block formats
  int64_t block_bytes;  ///< e.g. Q4_1: 20 (fp16 d, fp16 m, 16 bytes of nibbles) = 5 bits/value
  bool dequantizable;   ///< dequantize_row supports it
};

/// \brief Traits of a ggml type number, or nullptr if the number is not a known type.
const TypeTraits* type_traits(uint32_t type);

/// \brief "Q4_1 (3)"-style name of a type number (also for unknown numbers).
std::string ggml_type_name(uint32_t type);

/// \brief Decodes `n` values of `type` (n a multiple of the block size) from `src` into `dst`.
/// Throws kvq::Error for types without a decoder.
void dequantize_row(GgmlType type, const uint8_t* src, int64_t n, float* dst);

/// \brief One tensor's header entry.
struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;  ///< ggml order: dims[0] (ne[0]) varies fastest, i.e. a row
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;    ///< from the start of the data section
  uint64_t nbytes = 0;    ///< bytes of data
  int64_t nelements = 0;  ///< product of dims
};

/// \brief A parsed GGUF file. Every accessor throws kvq::Error with a one-line message naming the
/// file and the key or tensor; integer getters accept any integer type whose value fits.
class GgufFile {
 public:
  /// \brief Memory-maps and parses `path`.
  static GgufFile open(const std::string& path);
  /// \brief Parses GGUF bytes held in memory; `name` stands for the file in error messages.
  static GgufFile parse(std::string bytes, const std::string& name);

  const std::string& name() const { return name_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  ///< file offset of the data section

  /// \brief Metadata in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  /// \brief The value of `key`, or nullptr.
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  /// \brief The value of `key`; throws if it is missing.
  const Value& get(std::string_view key) const;

  uint32_t get_u32(std::string_view key) const;
  int32_t get_i32(std::string_view key) const;
  uint64_t get_u64(std::string_view key) const;
  int64_t get_i64(std::string_view key) const;
  float get_f32(std::string_view key) const;   ///< float32 or float64 (rounded)
  double get_f64(std::string_view key) const;  ///< float32 or float64
  bool get_bool(std::string_view key) const;
  std::string get_string(std::string_view key) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int32_t> get_i32_array(std::string_view key) const;  ///< any integer element type
  std::vector<float> get_f32_array(std::string_view key) const;    ///< float32 / float64
  /// \brief Element count of the array at `key`.
  uint64_t array_size(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// \brief The tensor named `name`, or nullptr.
  const TensorInfo* find_tensor(std::string_view name) const;
  /// \brief The tensor named `name`; throws if there is none.
  const TensorInfo& tensor(std::string_view name) const;
  /// \brief The tensor's raw bytes (a view into the mapping).
  std::span<const uint8_t> tensor_data(const TensorInfo& t) const;
  /// \brief All values as float, in memory order (dims[0] fastest).
  std::vector<float> dequantize(const TensorInfo& t) const;
  std::vector<float> dequantize(std::string_view name) const { return dequantize(tensor(name)); }

 private:
  GgufFile() = default;
  void parse_all();

  std::string name_;
  std::shared_ptr<const void> owner_;  // keeps the mapping (or the byte string) alive
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace kvq::gguf
