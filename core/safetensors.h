// safetensors files: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the raw little-endian data. kvq writes and reads F32 (and reads F16/BF16).
#pragma once

#include <cstdint>
#include <map>
#include <string>
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

}  // namespace kvq
