// Test helpers for kivi/: deterministic inputs with outlier channels, and an independent naive
// quantizer written from REFERENCE.md section 3 and the layout of kivi/layout.h with plain loops,
// sharing no code with kivi/ (only core/half.h for fp16 rounding).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/half.h"
#include "core/spec.h"
#include "core/tensor.h"

namespace kvq::kivi::naive {

/// \brief Gaussian [T, H, D] tensor (fixed seed) with outlier channels: channel 3 of every head
/// scaled x20, channel 17 (if present) shifted by +40 and scaled x8, as keys have (KIVI).
inline Tensor3 random_kv(int64_t tokens, int64_t heads, int64_t dim, uint64_t seed) {
  Tensor3 x(Shape3{tokens, heads, dim});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t d = 0; d < dim; ++d) {
        float v = normal(rng) * (0.5f + 0.25f * static_cast<float>(h));
        if (d == 3) v *= 20.0f;
        if (d == 17) v = 40.0f + 8.0f * v;
        x.at(t, h, d) = v;
      }
  return x;
}

/// \brief What the naive quantizer stores: words, fp16 scales and minima, in the cache layout.
struct NaiveStore {
  std::vector<uint32_t> words;
  std::vector<uint16_t> scales, mins;
};

/// \brief Quantizes one group given by its values: fills codes, returns scale and min bits.
/// Min, max and the code quotient in double; the scale is float32 arithmetic because that is
/// its definition (kivi/minmax.h: fp16(float32(float32(mx - mn) / n))); then fp16 rounding.
inline void naive_group(const std::vector<float>& v, int bits, bool sym,
                        std::vector<uint32_t>& codes, uint16_t& scale_h, uint16_t& min_h) {
  double mn = v[0], mx = v[0];
  for (float f : v) {
    mn = std::min(mn, static_cast<double>(f));
    mx = std::max(mx, static_cast<double>(f));
  }
  mn = mn == 0.0 ? 0.0 : mn;  // zeros as +0 (kivi/minmax.h)
  mx = mx == 0.0 ? 0.0 : mx;
  codes.assign(v.size(), 0);
  if (sym) {
    const int qmax = (1 << (bits - 1)) - 1;
    const double amax = std::max(-mn, mx);
    scale_h = float_to_half_bits(static_cast<float>(amax) / static_cast<float>(qmax));
    min_h = 0;
    const double s = half_bits_to_float(scale_h);
    for (size_t i = 0; i < v.size(); ++i) {
      double q = s > 0 ? std::clamp(v[i] / s, -static_cast<double>(qmax), double(qmax)) : 0.0;
      codes[i] = static_cast<uint32_t>(std::nearbyint(q) + (1 << (bits - 1)));  // ties to even
    }
    return;
  }
  const int n = (1 << bits) - 1;
  const float range = static_cast<float>(mx) - static_cast<float>(mn);
  scale_h = float_to_half_bits(range / static_cast<float>(n));
  min_h = float_to_half_bits(static_cast<float>(mn));
  const double s = half_bits_to_float(scale_h), m = half_bits_to_float(min_h);
  for (size_t i = 0; i < v.size(); ++i) {
    const double q = s > 0 ? std::clamp((v[i] - m) / s, 0.0, static_cast<double>(n)) : 0.0;
    codes[i] = static_cast<uint32_t>(std::nearbyint(q));  // default rounding: ties to even
  }
}

/// \brief Appends codes packed KIVI's way: 32/b per word, code i at bits [i*b, (i+1)*b).
inline void naive_pack(const std::vector<uint32_t>& codes, int bits, std::vector<uint32_t>& out) {
  const size_t per = static_cast<size_t>(32 / bits);
  for (size_t w = 0; w * per < codes.size(); ++w) {
    uint32_t word = 0;
    for (size_t i = 0; i < per && w * per + i < codes.size(); ++i)
      word |= codes[w * per + i] << (i * static_cast<size_t>(bits));
    out.push_back(word);
  }
}

/// \brief The naive store of the first `tq` tokens of x on `axis` with group G.
inline NaiveStore naive_store(const Tensor3& x, int64_t tq, Axis axis, int group, int bits,
                              bool sym) {
  NaiveStore s;
  const int64_t H = x.shape.heads, D = x.shape.dim;
  std::vector<float> v;
  std::vector<uint32_t> codes;
  uint16_t sh = 0, mh = 0;
  auto emit = [&] {
    naive_group(v, bits, sym, codes, sh, mh);
    naive_pack(codes, bits, s.words);
    s.scales.push_back(sh);
    if (!sym) s.mins.push_back(mh);
  };
  if (axis == Axis::Channel) {
    for (int64_t g = 0; g < tq / group; ++g)  // group-major, then head, then channel
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          v.clear();
          for (int64_t i = 0; i < group; ++i) v.push_back(x.at(g * group + i, h, d));
          emit();
        }
  } else {
    for (int64_t t = 0; t < tq; ++t)  // token-major, then head, then channel group
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c0 = 0; c0 < D; c0 += group) {
          v.clear();
          for (int64_t d = c0; d < std::min<int64_t>(c0 + group, D); ++d)
            v.push_back(x.at(t, h, d));
          emit();
        }
  }
  return s;
}

}  // namespace kvq::kivi::naive
