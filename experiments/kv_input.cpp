#include "experiments/kv_input.h"

#include <cmath>

#include "core/error.h"
#include "core/npy.h"

namespace kvq::cli {

KvInput load_kv(const std::string& path) {
  NpyArray a = read_npy(path);
  const auto& s = a.shape;
  if (s.size() != 2 && s.size() != 3)
    fail("{}: rank {} array; expected [tokens, heads, head_dim] or [tokens, head_dim]", path, s.size());
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == 0) fail("{}: zero-sized array (dimension {} is 0)", path, i);
  KvInput in;
  in.file_shape = s;
  in.tensor.shape = s.size() == 3 ? Shape3{s[0], s[1], s[2]} : Shape3{s[0], 1, s[1]};
  for (size_t i = 0; i < a.data.size(); ++i) {
    if (!std::isfinite(a.data[i])) {
      const Shape3& sh = in.tensor.shape;
      const int64_t t = static_cast<int64_t>(i) / (sh.heads * sh.dim);
      const int64_t h = static_cast<int64_t>(i) / sh.dim % sh.heads;
      const int64_t d = static_cast<int64_t>(i) % sh.dim;
      fail("{}: non-finite value {} at token {}, head {}, channel {}; KV caches must be finite",
           path, a.data[i], t, h, d);
    }
  }
  in.tensor.data = std::move(a.data);
  return in;
}

}  // namespace kvq::cli
