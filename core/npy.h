// NumPy .npy files (format versions 1.0, 2.0, 3.0): float16 / float32 / float64 in either byte
// order in, float32 out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvq {

/// \brief An n-d float array read from an .npy file (float16 is widened exactly, float64 rounded
/// to the nearest float32).
struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
  std::string descr;  ///< the file's dtype string, e.g. "<f4"
};

/// \brief Parses .npy bytes; `name` is used in error messages. Rejects Fortran order, dtypes other
/// than float16/32/64 (either byte order), and headers whose shape disagrees with the data size.
NpyArray parse_npy(const std::string& bytes, const std::string& name);

/// \brief Reads an .npy file (see parse_npy).
NpyArray read_npy(const std::string& path);

/// \brief Serializes a float32 C-order array as .npy (version 1.0) bytes.
std::string encode_npy(const std::vector<int64_t>& shape, const float* data);

/// \brief Writes a float32 .npy file atomically.
void write_npy(const std::string& path, const std::vector<int64_t>& shape, const float* data);

}  // namespace kvq
