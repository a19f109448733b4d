// Loading a K or V tensor for the CLI: npy or a safetensors tensor, [tokens, heads, head_dim] or
// [tokens, head_dim].
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace kvq::cli {

/// \brief A tensor as the CLI reads it, with the file's own shape (for writing back).
struct KvInput {
  Tensor3 tensor;
  std::vector<int64_t> file_shape;
};

/// \brief Reads `arg`: an npy (float16/32/64, either byte order; a conversion other than float32
/// is noted on stderr), FILE.safetensors:TENSOR (e.g. a `kvq model dump`'s layer.3.k), or
/// FILE.safetensors holding one tensor. Rank 2 is [T, D] (one head). Rejects other ranks, zero
/// sizes and non-finite values (naming the first position).
KvInput load_kv(const std::string& arg);

/// \brief Whether a path names a safetensors file (by its extension).
bool is_safetensors(const std::string& path);
/// \brief The file an input argument reads: FILE.safetensors:TENSOR (or FILE:TENSOR of an existing
/// FILE) -> FILE, a plain path -> itself (load_kv's own reading of the argument).
std::string kv_input_file(const std::string& arg);

/// \brief load_kv's checks and shape rules on an array already read (`arg` names it in errors).
KvInput as_kv(const std::string& arg, std::vector<int64_t> shape, std::vector<float> data);

}  // namespace kvq::cli
