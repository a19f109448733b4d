// The int family's reference storage (reference_cpu/schemes.h): the streaming KIVI cache
// (kivi/cache.h), codes outside the residual window, with attention reads over the packed codes
// (layout: kivi/layout.h).
//
// Per-channel keys fold each (head, channel)'s scale into the query once per token group:
//   <q, k_t> = sum_d (q_d * scale_gd) * code_td + sum_d q_d * min_gd
// Per-token values weight each token's codes by its probability times its scale:
//   o_d += (p_t * scale_tc) * code_td,  and  p_t * min_tc once per channel group.
// (The mirror images - per-token keys, per-channel values - fold the same way.) Symmetric codes
// read as (code - 2^(b-1)) * scale, i.e. an asymmetric min of -2^(b-1) * scale.

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kivi/cache.h"
#include "kivi/group.h"
#include "kivi/layout.h"
#include "kivi/minmax.h"
#include "kivi/tensor_quant.h"
#include "reference_cpu/dense_ops.h"
#include "reference_cpu/schemes.h"

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

class IntSide final : public SideStore {
 public:
  IntSide(const SchemeSpec& spec, Role role, int64_t H, int64_t D, const kivi::GroupQuantizers& q)
      : spec_(spec), role_(role), cache_(spec.q(), role, H, D, q) {}

  void append(const float* x, int64_t n) override { cache_.append(x, n); }
  int64_t tokens() const override { return cache_.tokens(); }
  int64_t heads() const override { return cache_.heads(); }
  int64_t dim() const override { return cache_.head_dim(); }
  int64_t quantized_tokens_at(int64_t t) const override {
    return kvq::quantized_tokens(spec_.q(), cache_.axis(), t);
  }
  Tensor3 dequantize() const override { return cache_.dequantize(); }
  void exact_tail(std::vector<float>& out) const override {
    const auto r = cache_.residual();
    out.insert(out.end(), r.begin(), r.end());
  }
  Footprint footprint() const override { return cache_.footprint(); }
  StoredSide stored() const override {
    StoredSide s{SchemeKind::Int, tokens(), heads(), dim()};
    s.words = cache_.words().data();
    s.scales = cache_.scales().data();
    s.mins = cache_.sym() ? nullptr : cache_.mins().data();
    s.residual = cache_.residual().data();
    s.quantized_tokens = cache_.quantized_tokens();
    s.group = cache_.group();
    s.bits = cache_.bits();
    s.axis = cache_.axis();
    s.sym = cache_.sym();
    return s;
  }

  void dot(int64_t h, const float* q, int nq, int64_t t0, int64_t t1, float* s,
           int64_t ld) const override {
    const int64_t qt = cache_.quantized_tokens();
    const int64_t te = std::min(t1, qt);
    if (t0 < te)
      kivi::dispatch_bits(cache_.bits(), [&]<int B>() {
        if (cache_.axis() == Axis::Channel)
          dot_channel<B>(h, q, nq, t0, te, s, ld);
        else
          dot_token<B>(h, q, nq, t0, te, s, ld);
      });
    const int64_t r0 = std::max(t0, qt);
    if (r0 < t1)
      dense_dot(cache_.residual().data() - qt * heads() * dim(), heads(), dim(), h, q, nq, r0, t1,
                s + (r0 - t0), ld);
  }

  void accumulate(int64_t h, const float* p, int nq, int64_t t0, int64_t t1, int64_t ld,
                  float* out) const override {
    const int64_t qt = cache_.quantized_tokens();
    const int64_t te = std::min(t1, qt);
    if (t0 < te)
      kivi::dispatch_bits(cache_.bits(), [&]<int B>() {
        if (cache_.axis() == Axis::Token)
          acc_token<B>(h, p, nq, t0, te, ld, out);
        else
          acc_channel<B>(h, p, nq, t0, te, ld, out);
      });
    const int64_t r0 = std::max(t0, qt);
    if (r0 < t1)
      dense_accumulate(cache_.residual().data() - qt * heads() * dim(), heads(), dim(), h,
                       p + (r0 - t0), nq, r0, t1, ld, out);
  }

 private:
  // Scale and (effective) min of a group as floats.
  void params(int64_t i, float& sc, float& mn) const {
    sc = half_bits_to_float(cache_.scales()[static_cast<size_t>(i)]);
    mn = cache_.sym() ? -static_cast<float>(kivi::sym_offset(cache_.bits())) * sc
                      : half_bits_to_float(cache_.mins()[static_cast<size_t>(i)]);
  }

  template <int B>
  void dot_channel(int64_t h, const float* q, int nq, int64_t t0, int64_t t1, float* s,
                   int64_t ld) const {
    const ChannelLayout L = cache_.channel_layout();
    const int G = L.group;
    const int64_t D = L.dim;
    const uint32_t* words = cache_.words().data();
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
    const TokenLayout L = cache_.token_layout();
    const int64_t D = L.dim, ncg = L.channel_groups();
    const uint32_t* words = cache_.words().data();
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
    const TokenLayout L = cache_.token_layout();
    const int64_t D = L.dim, ncg = L.channel_groups();
    const uint32_t* words = cache_.words().data();
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
    const ChannelLayout L = cache_.channel_layout();
    const int G = L.group;
    const int64_t D = L.dim;
    const uint32_t* words = cache_.words().data();
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

  SchemeSpec spec_;
  Role role_;
  kivi::SideCache cache_;
};

std::unique_ptr<SideStore> make(const SchemeSpec& spec, Role role, int64_t heads, int64_t dim, int,
                                const SideKernels& kernels) {
  return std::make_unique<IntSide>(spec, role, heads, dim, kernels.kivi);
}

Tensor3 round_trip(const SchemeSpec& spec, Role role, const Tensor3& x, int) {
  return kivi::round_trip(spec.q(), role, x);
}

// The packed words, fp16 scales and minima of the first `qt` tokens (kivi/layout.h), the layout
// spelled out in the metadata.
int64_t stored_bytes(const StoredSide& s, int64_t qt, StoredBytes& out) {
  const int64_t H = s.heads, D = s.dim;
  int64_t nw = 0, np = 0;
  if (s.axis == Axis::Channel) {
    const ChannelLayout lay{H, D, s.group, s.bits};
    nw = lay.words_for_tokens(qt);
    np = lay.params_for_tokens(qt);
    out.meta["layout"] = fmt::format(
        "per-channel: token group g = t / {0} of (head h, channel d) has scale/min index "
        "(g * {1} + h) * {2} + d and its {3} words start at that index times {3}; code i = t % "
        "{0} sits at bit {4} * (i % {5}) of the group's word i / {5}",
        s.group, H, D, lay.words_per_group(), s.bits, kivi::codes_per_word(s.bits));
  } else {
    const TokenLayout lay{H, D, s.group, s.bits};
    nw = lay.words_for_tokens(qt);
    np = lay.params_for_tokens(qt);
    out.meta["layout"] = fmt::format(
        "per-token: (token t, head h, channel group c = d / {0}) has scale/min index (t * {1} "
        "+ "
        "h) * {2} + c and its words start at (t * {1} + h) * {3} + c * {4}; code i = d % {0} "
        "sits at bit {5} * (i % {6}) of the group's word i / {6}",
        s.group, H, lay.channel_groups(), lay.words_per_token_head(),
        kivi::words_for(s.group, s.bits), s.bits, kivi::codes_per_word(s.bits));
  }
  out.add("words", "U32", {nw}, s.words, nw * 4);
  out.add("scales", "F16", {np}, s.scales, np * 2);
  if (!s.sym) out.add("mins", "F16", {np}, s.mins, np * 2);
  out.meta["bits"] = std::to_string(s.bits);
  out.meta["group"] = std::to_string(s.group);
  out.meta["axis"] = std::string(to_string(s.axis));
  out.meta["value"] = s.sym ? fmt::format("scale * (code - {})", kivi::sym_offset(s.bits))
                            : std::string("min + scale * code");
  return qt;
}

}  // namespace

extern const SchemeStorage kIntStorage;
const SchemeStorage kIntStorage{"int", make, round_trip, stored_bytes};

}  // namespace kvq
