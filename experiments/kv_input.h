// Loading a K or V tensor for the CLI: npy [tokens, heads, head_dim] or [tokens, head_dim].
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

/// \brief Reads an npy; rank 2 is [T, D] (one head). Rejects other ranks, zero sizes and
/// non-finite values (naming the first position).
KvInput load_kv(const std::string& path);

}  // namespace kvq::cli
