// safetensors files: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the raw little-endian data. kvq writes and reads F32 (and reads F16/BF16); MappedSafetensors
// maps a file of any dtype (a Hugging Face checkpoint's shards) and hands out views of its tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvq {

/// \brief A named float32 tensor for safetensors I/O.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

/// \brief A tensor of any safetensors dtype as raw little-endian bytes (U8, U16, U32, F16, F32...).
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

/// \brief Writes raw tensors and string metadata atomically; each tensor's byte count must be its
/// shape's element count times its dtype's size.
void write_safetensors(const std::string& path, const std::vector<RawTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// \brief Writes tensors (F32) and string metadata atomically.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// \brief Reads every tensor (F32, F16 and BF16 widened to float); errors name the file and the
/// bad entry (bad header length, JSON, dtype, offsets outside the data, shape/size mismatch).
std::vector<NamedTensor> read_safetensors(const std::string& path);
/// \brief read_safetensors on bytes held in memory; `name` stands for the file in messages.
std::vector<NamedTensor> parse_safetensors(const std::string& bytes, const std::string& name);

/// \brief Bytes per value of a safetensors dtype (BOOL, U8, I8, F8_E4M3, F8_E5M2, U16, I16, F16,
/// BF16, U32, I32, F32, U64, I64, F64); 0 for a name safetensors does not define.
size_t safetensors_dtype_size(std::string_view dtype);

/// \brief One header entry: a tensor's dtype, shape and where its bytes lie in the file.
struct SafetensorsEntry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  ///< from the start of the file
  uint64_t bytes = 0;
};

/// \brief Writes the file streaming: the header of `tensors` (name, dtype, shape; offsets and
/// bytes are computed here), then `write_bytes(i, out)` writes tensor i's data, which must be its
/// shape's element count times its dtype's size (checked). Atomic (a temporary renamed into
/// place); nothing but the header is held, so it writes files larger than memory.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::function<void(size_t, std::ostream&)>& write_bytes,
                       const std::map<std::string, std::string>& metadata = {});

/// \brief Parses and checks the header of a safetensors file of `file_size` bytes whose first
/// bytes are `head` (at least 8 + the header length); errors name `name` and the bad entry (bad
/// header length, JSON, unknown dtype, offsets outside the data, shape/size mismatch). Entries in
/// header order; __metadata__ skipped.
std::vector<SafetensorsEntry> parse_safetensors_header(std::string_view head, uint64_t file_size,
                                                       const std::string& name);

/// \brief A safetensors file memory-mapped read-only: its header parsed, its tensors' bytes views
/// into the mapping (nothing copied).
class MappedSafetensors {
 public:
  static MappedSafetensors open(const std::string& path);
  const std::string& name() const { return name_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  /// \brief The first byte of `e`'s data (an entry of this file).
  const uint8_t* data(const SafetensorsEntry& e) const { return base_ + e.offset; }
  /// \brief Lets the kernel drop the pages holding only `e`'s data from memory (a reader done
  /// with it: the model once it packed the tensor); reading it again maps them back from the file.
  void release(const SafetensorsEntry& e) const;
  /// \brief Shares ownership of the mapping: it stays mapped while any copy lives (views handed
  /// to a model that multiplies in place).
  const std::shared_ptr<const void>& owner() const { return owner_; }

 private:
  std::string name_;
  std::shared_ptr<const void> owner_;  // the mapping
  const uint8_t* base_ = nullptr;
  std::vector<SafetensorsEntry> entries_;
};

}  // namespace kvq
