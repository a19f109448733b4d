// The int family's reference reads (reference_cpu/reads.h) over its stored view
// (schemes/int/storage.cpp): the packed KIVI codes (layout: kivi/layout.h) below the residual
// window, the exact residual above it.
//
// Per-channel keys fold each (head, channel)'s scale into the query once per token group:
//   <q, k_t> = sum_d (q_d * scale_gd) * code_td + sum_d q_d * min_gd
// Per-token values weight each token's codes by its probability times its scale:
//   o_d += (p_t * scale_tc) * code_td,  and  p_t * min_tc once per channel group.
// (The mirror images - per-token keys, per-channel values - fold the same way.) Symmetric codes
// read as (code - 2^(b-1)) * scale, i.e. an asymmetric min of -2^(b-1) * scale.
#include "reference_cpu/reads.h"

#include <algorithm>
#include <vector>

#include "core/half.h"
#include "kivi/group.h"
#include "kivi/layout.h"
#include "kivi/minmax.h"
#include "reference_cpu/dense_ops.h"

namespace kvq {
namespace {

using kivi::ChannelLayout;
using kivi::TokenLayout;

// Unpacks n codes from consecutive words as floats (bit positions from kivi/pack.h). Whole
// words unpack straight into `out` (a fixed-length loop the compiler vectorizes).
template <int B>
inline void unpack_run(const uint32_t* words, int n, float* out) {
  constexpr int kCpw = kivi::codes_per_word(B);
  const int full = n / kCpw;
  for (int w = 0; w < full; ++w) {
    const uint32_t word = words[w];
    float* o = out + w * kCpw;
#pragma omp simd
    for (int j = 0; j < kCpw; ++j)
      o[j] = static_cast<float>((word >> kivi::shift_of(j, B)) & kivi::code_mask(B));
  }
  for (int j = full * kCpw; j < n; ++j) out[j] = static_cast<float>(kivi::unpack_one(words, j, B));
}

// The reads of one int view (a KIVI side's bytes: StoredSide's words, scales, mins, residual).
class IntReads {
 public:
  explicit IntReads(const StoredSide& x) : x_(x) {}

  void dot(int64_t h, const float* q, int nq, int64_t t0, int64_t t1, float* s, int64_t ld) const {
    const int64_t qt = x_.quantized_tokens;
    const int64_t te = std::min(t1, qt);
    if (t0 < te)
      kivi::dispatch_bits(x_.bits, [&]<int B>() {
        if (x_.axis == Axis::Channel)
          dot_channel<B>(h, q, nq, t0, te, s, ld);
        else
          dot_token<B>(h, q, nq, t0, te, s, ld);
      });
    const int64_t r0 = std::max(t0, qt);
    if (r0 < t1)
      dense_dot(x_.residual - qt * x_.heads * x_.dim, x_.heads, x_.dim, h, q, nq, r0, t1,
                s + (r0 - t0), ld);
  }

  void accumulate(int64_t h, const float* p, int nq, int64_t t0, int64_t t1, int64_t ld,
                  float* out) const {
    const int64_t qt = x_.quantized_tokens;
    const int64_t te = std::min(t1, qt);
    if (t0 < te)
      kivi::dispatch_bits(x_.bits, [&]<int B>() {
        if (x_.axis == Axis::Token)
          acc_token<B>(h, p, nq, t0, te, ld, out);
        else
          acc_channel<B>(h, p, nq, t0, te, ld, out);
      });
    const int64_t r0 = std::max(t0, qt);
    if (r0 < t1)
      dense_accumulate(x_.residual - qt * x_.heads * x_.dim, x_.heads, x_.dim, h, p + (r0 - t0), nq,
                       r0, t1, ld, out);
  }

 private:
  // Scale and (effective) min of a group as floats.
  void params(int64_t i, float& sc, float& mn) const {
    sc = half_bits_to_float(x_.scales[i]);
    mn = x_.sym ? -static_cast<float>(kivi::sym_offset(x_.bits)) * sc
                : half_bits_to_float(x_.mins[i]);
  }

  template <int B>
  void dot_channel(int64_t h, const float* q, int nq, int64_t t0, int64_t t1, float* s,
                   int64_t ld) const {
    const ChannelLayout L{x_.heads, x_.dim, x_.group, x_.bits};
    const int G = L.group;
    const int64_t D = L.dim;
    const uint32_t* words = x_.words;
    std::vector<float> acc(static_cast<size_t>(nq * G)), codes(static_cast<size_t>(G));
    std::vector<float> base(static_cast<size_t>(nq));
    for (int64_t g = t0 / G; g * G < t1; ++g) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(base.begin(), base.end(), 0.0f);
      for (int64_t d = 0; d < D; ++d) {
        float sc, mn;
        params(L.param_index(g, h, d), sc, mn);
        unpack_run<B>(words + L.word_index(g, h, d), G, codes.data());
        for (int i = 0; i < nq; ++i) {
          const float qs = q[i * D + d] * sc;
          base[static_cast<size_t>(i)] += q[i * D + d] * mn;
          float* a = acc.data() + i * G;
#pragma omp simd
          for (int j = 0; j < G; ++j) a[j] += qs * codes[static_cast<size_t>(j)];
        }
      }
      for (int64_t t = std::max(t0, g * G); t < std::min(t1, (g + 1) * G); ++t)
        for (int i = 0; i < nq; ++i)
          s[i * ld + (t - t0)] =
              acc[static_cast<size_t>(i * G + (t - g * G))] + base[static_cast<size_t>(i)];
    }
  }

  template <int B>
  void dot_token(int64_t h, const float* q, int nq, int64_t t0, int64_t t1, float* s,
                 int64_t ld) const {
    const TokenLayout L{x_.heads, x_.dim, x_.group, x_.bits};
    const int64_t D = L.dim, ncg = L.channel_groups();
    const uint32_t* words = x_.words;
    std::vector<float> codes(static_cast<size_t>(D)), qsum(static_cast<size_t>(nq * ncg), 0.0f);
    for (int i = 0; i < nq; ++i)
      for (int64_t c = 0; c < ncg; ++c)
        for (int j = 0; j < L.group_len(c); ++j)
          qsum[static_cast<size_t>(i * ncg + c)] += q[i * D + c * L.group + j];
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t c = 0; c < ncg; ++c)
        unpack_run<B>(words + L.word_index(t, h, c), L.group_len(c), codes.data() + c * L.group);
      for (int i = 0; i < nq; ++i) {
        float total = 0;
        for (int64_t c = 0; c < ncg; ++c) {
          float sc, mn;
          params(L.param_index(t, h, c), sc, mn);
          const float* qi = q + i * D + c * L.group;
          const float* cc = codes.data() + c * L.group;
          float a = 0;
          const int n = L.group_len(c);
#pragma omp simd reduction(+ : a)
          for (int j = 0; j < n; ++j) a += qi[j] * cc[j];
          total += sc * a + mn * qsum[static_cast<size_t>(i * ncg + c)];
        }
        s[i * ld + (t - t0)] = total;
      }
    }
  }

  template <int B>
  void acc_token(int64_t h, const float* p, int nq, int64_t t0, int64_t t1, int64_t ld,
                 float* out) const {
    const TokenLayout L{x_.heads, x_.dim, x_.group, x_.bits};
    const int64_t D = L.dim, ncg = L.channel_groups();
    const uint32_t* words = x_.words;
    std::vector<float> codes(static_cast<size_t>(D)), mins(static_cast<size_t>(nq * ncg), 0.0f);
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t c = 0; c < ncg; ++c) {
        float sc, mn;
        params(L.param_index(t, h, c), sc, mn);
        const int n = L.group_len(c);
        float* cc = codes.data() + c * L.group;
        unpack_run<B>(words + L.word_index(t, h, c), n, cc);
        for (int i = 0; i < nq; ++i) {
          const float pt = p[i * ld + (t - t0)];
          const float w = pt * sc;
          mins[static_cast<size_t>(i * ncg + c)] += pt * mn;
          float* o = out + i * D + c * L.group;
#pragma omp simd
          for (int j = 0; j < n; ++j) o[j] += w * cc[j];
        }
      }
    }
    for (int i = 0; i < nq; ++i)
      for (int64_t c = 0; c < ncg; ++c)
        for (int j = 0; j < L.group_len(c); ++j)
          out[i * D + c * L.group + j] += mins[static_cast<size_t>(i * ncg + c)];
  }

  template <int B>
  void acc_channel(int64_t h, const float* p, int nq, int64_t t0, int64_t t1, int64_t ld,
                   float* out) const {
    const ChannelLayout L{x_.heads, x_.dim, x_.group, x_.bits};
    const int G = L.group;
    const int64_t D = L.dim;
    const uint32_t* words = x_.words;
    std::vector<float> codes(static_cast<size_t>(G)), pw(static_cast<size_t>(nq * G));
    std::vector<float> psum(static_cast<size_t>(nq));
    for (int64_t g = t0 / G; g * G < t1; ++g) {
      // This group's probabilities, zero outside [t0, t1).
      for (int i = 0; i < nq; ++i) {
        psum[static_cast<size_t>(i)] = 0;
        for (int j = 0; j < G; ++j) {
          const int64_t t = g * G + j;
          const float v = (t >= t0 && t < t1) ? p[i * ld + (t - t0)] : 0.0f;
          pw[static_cast<size_t>(i * G + j)] = v;
          psum[static_cast<size_t>(i)] += v;
        }
      }
      for (int64_t d = 0; d < D; ++d) {
        float sc, mn;
        params(L.param_index(g, h, d), sc, mn);
        unpack_run<B>(words + L.word_index(g, h, d), G, codes.data());
        for (int i = 0; i < nq; ++i) {
          const float* pi = pw.data() + i * G;
          float a = 0;
#pragma omp simd reduction(+ : a)
          for (int j = 0; j < G; ++j) a += pi[j] * codes[static_cast<size_t>(j)];
          out[i * D + d] += sc * a + mn * psum[static_cast<size_t>(i)];
        }
      }
    }
  }

  const StoredSide& x_;
};

void dot(const StoredSide& x, int64_t h, const float* q, int nq, int64_t t0, int64_t t1, float* s,
         int64_t ld) {
  IntReads(x).dot(h, q, nq, t0, t1, s, ld);
}

void accumulate(const StoredSide& x, int64_t h, const float* p, int nq, int64_t t0, int64_t t1,
                int64_t ld, float* out) {
  IntReads(x).accumulate(h, p, nq, t0, t1, ld, out);
}

}  // namespace

extern const SchemeReads kIntReads;
const SchemeReads kIntReads{"int", dot, accumulate};

}  // namespace kvq
