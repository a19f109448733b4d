// A little GGUF writer for tests: files built byte by byte, per ggml's docs/gguf.md.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/gguf.h"

namespace kvq::testing::gguf_writer {

using ::kvq::gguf::GgmlType;
using VT = ::kvq::gguf::ValueType;

template <typename T>
inline std::string le(T v) {  // raw little-endian bytes of a scalar
  std::string s(sizeof v, '\0');
  std::memcpy(s.data(), &v, sizeof v);
  return s;
}
inline std::string u32(uint32_t v) { return le(v); }
inline std::string u64(uint64_t v) { return le(v); }
inline std::string gstr(std::string_view v) {
  return u64(v.size()) + std::string(v);
}  // GGUF string
inline std::string vtype(VT t) { return u32(static_cast<uint32_t>(t)); }
// Array payload: element type, count, then the encoded elements.
inline std::string garray(VT elem, uint64_t count, const std::string& elems) {
  return vtype(elem) + u64(count) + elems;
}

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  std::string data;                // raw block bytes
  std::optional<uint64_t> offset;  // forced offset (default: packed, aligned)
};

struct Builder {
  uint32_t version = 3;
  uint64_t align = 32;  // padding used by build(); add "general.alignment" to change the reader's
  std::optional<uint64_t> tensor_count, kv_count;  // forced header counts
  std::vector<std::string> kvs;
  std::vector<TensorSpec> tensors;

  Builder& kv(std::string_view key, VT type, const std::string& payload) {
    kvs.push_back(gstr(key) + vtype(type) + payload);
    return *this;
  }
  Builder& tensor(TensorSpec t) {
    tensors.push_back(std::move(t));
    return *this;
  }
  std::string build() const {
    std::string b = "GGUF" + u32(version) + u64(tensor_count.value_or(tensors.size())) +
                    u64(kv_count.value_or(kvs.size()));
    for (const auto& k : kvs) b += k;
    std::vector<uint64_t> offs;
    uint64_t off = 0;
    for (const auto& t : tensors) {
      b += gstr(t.name) + u32(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) b += u64(d);
      b += u32(t.type);
      offs.push_back(off);
      b += u64(t.offset.value_or(off));
      off = (off + t.data.size() + align - 1) / align * align;
    }
    const size_t data_start = (b.size() + align - 1) / align * align;
    for (size_t i = 0; i < tensors.size(); ++i) {
      b.resize(data_start + offs[i], '\0');
      b += tensors[i].data;
    }
    return b;
  }
};

// One-tensor file: metadata "general.architecture", then the tensor.
inline std::string one_tensor(const std::string& name, std::vector<uint64_t> dims, GgmlType type,
                              const std::string& data) {
  return Builder{}
      .kv("general.architecture", VT::kString, gstr("test"))
      .tensor({name, std::move(dims), static_cast<uint32_t>(type), data, {}})
      .build();
}

}  // namespace kvq::testing::gguf_writer
