// A KV-cache tensor of one layer: [tokens, kv_heads, head_dim], float32, C order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvq {

/// \brief Shape of one layer's K or V cache: T tokens x H kv heads x D channels.
struct Shape3 {
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t dim = 0;
  int64_t numel() const { return tokens * heads * dim; }
  bool operator==(const Shape3&) const = default;
};

/// \brief Owning float32 tensor [T, H, D] in C order (token-major, then head, then channel).
struct Tensor3 {
  Shape3 shape;
  std::vector<float> data;

  Tensor3() = default;
  explicit Tensor3(Shape3 s) : shape(s), data(static_cast<size_t>(s.numel()), 0.0f) {}
  float& at(int64_t t, int64_t h, int64_t d) {
    return data[static_cast<size_t>((t * shape.heads + h) * shape.dim + d)];
  }
  float at(int64_t t, int64_t h, int64_t d) const {
    return data[static_cast<size_t>((t * shape.heads + h) * shape.dim + d)];
  }
};

}  // namespace kvq
