// The fp8 family's reference storage (reference_cpu/schemes.h): one code per element + scales
// (token scales grow per token; tensor/head/channel dynamic scales are computed from the first
// `first` tokens - the prefill - and then frozen, as vLLM's calculate-kv-scales; constant and
// calib scales are fixed).
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "fp8/scale.h"
#include "reference_cpu/dense_ops.h"
#include "reference_cpu/schemes.h"

namespace kvq {
namespace {

class Fp8Side final : public SideStore {
 public:
  Fp8Side(const SchemeSpec& spec, Role role, int64_t H, int64_t D, int layer, const SideKernels& k)
      : spec_(spec),
        role_(role),
        H_(H),
        D_(D),
        scales_fn_(k.fp8_scales ? k.fp8_scales : fp8::compute_scales),
        quantize_fn_(k.fp8_quantize ? k.fp8_quantize : fp8::quantize) {
    const Fp8Spec& f = spec.fp8();
    for (int c = 0; c < 256; ++c)
      lut_[static_cast<size_t>(c)] = fp8::decode(f.format, static_cast<uint8_t>(c));
    gran_ = f.source == ScaleSource::Constant ? Granularity::Tensor : f.gran;
    if (f.source == ScaleSource::Constant || f.source == ScaleSource::Calib) {
      // Fixed scales: a zero-token tensor is enough to read them (calib ignores the data).
      scales_ = fp8::compute_scales(f, role, Tensor3({0, H, D}), layer);
      frozen_ = true;
    }
  }
  void reserve(int64_t t) override { codes_.reserve(static_cast<size_t>(t * H_ * D_)); }
  void append(const float* x, int64_t n) override {
    if (n == 0) return;
    // The chunk as a tensor (the scale and quantize contracts take one), filled once: no
    // zero-fill first, no copy where the pending tokens are moved in (a long prefill's
    // gigabyte is touched as few times as it can be).
    Tensor3 chunk;
    chunk.shape = {n, H_, D_};
    if (gran_ == Granularity::Token || frozen_) chunk.data.assign(x, x + n * H_ * D_);
    if (gran_ == Granularity::Token) {
      const auto s = scales_fn_(spec_.fp8(), role_, chunk, 0);  // per (token, head): streaming-safe
      scales_.insert(scales_.end(), s.begin(), s.end());
      std::vector<uint8_t> c;
      quantize_fn_(spec_.fp8(), s, chunk, c);
      keep_codes(std::move(c));
      return;
    }
    if (!frozen_) {
      // Dynamic tensor / head / channel scales: held exact until `first` tokens have arrived, then
      // the scales come from exactly those tokens, whatever the chunking (spec.h).
      pending_.insert(pending_.end(), x, x + n * H_ * D_);
      const int64_t held = static_cast<int64_t>(pending_.size()) / (H_ * D_);
      if (held < spec_.fp8().first) return;
      chunk.shape = {held, H_, D_};
      chunk.data = std::move(pending_);
      pending_.clear();
      scales_ = fp8::prefill_scales(spec_.fp8(), role_, chunk);  // from the first `first` tokens
      frozen_ = true;
    }
    std::vector<uint8_t> c;
    quantize_fn_(spec_.fp8(), scales_, chunk, c);
    keep_codes(std::move(c));
  }
  // Appends a chunk's codes; the first chunk's vector is taken over unless reserve() made room.
  void keep_codes(std::vector<uint8_t>&& c) {
    nan_ = nan_ || fp8::any_nan_code(spec_.fp8().format, c.data(), static_cast<int64_t>(c.size()));
    if (codes_.empty() && codes_.capacity() < c.size())
      codes_ = std::move(c);
    else
      codes_.insert(codes_.end(), c.begin(), c.end());
  }
  int64_t tokens() const override {
    return static_cast<int64_t>(codes_.size() + pending_.size()) / (H_ * D_);
  }
  int64_t heads() const override { return H_; }
  int64_t dim() const override { return D_; }
  int64_t quantized_tokens_at(int64_t t) const override {
    return frozen_rule() && t < spec_.fp8().first ? 0 : t;
  }

  // One row of codes as floats: a 256-entry table filled from fp8::decode (the one definition);
  // a table load per element is cheaper here than the decode arithmetic.
  void widen(const uint8_t* c, float* out) const {
    for (int64_t d = 0; d < D_; ++d) out[d] = lut_[c[d]];
  }

  // Scale of element (t, h, d) factors as token_factor(t) * channel_factor(d).
  float token_factor(int64_t t, int64_t h) const {
    switch (gran_) {
      case Granularity::Tensor:
        return scales_[0];
      case Granularity::Head:
        return scales_[static_cast<size_t>(h)];
      case Granularity::Token:
        return scales_[static_cast<size_t>(t * H_ + h)];
      case Granularity::Channel:
        return 1.0f;
    }
    return 1.0f;
  }
  const float* channel_factors(int64_t h) const {
    return gran_ == Granularity::Channel ? scales_.data() + h * D_ : nullptr;
  }

  void dot(int64_t h, const float* q, int nq, int64_t t0, int64_t t1, float* s,
           int64_t ld) const override {
    if (!pending_.empty())
      return dense_dot(pending_.data(), H_, D_, h, q, nq, t0, t1, s, ld);  // all exact
    std::vector<float> qs(q, q + nq * D_), row(static_cast<size_t>(D_));
    if (const float* cf = channel_factors(h))  // fold per-channel scales into the query once
      for (int i = 0; i < nq; ++i)
        for (int64_t d = 0; d < D_; ++d) qs[static_cast<size_t>(i * D_ + d)] *= cf[d];
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* c = codes_.data() + (t * H_ + h) * D_;
      widen(c, row.data());
      const float f = token_factor(t, h);
      for (int i = 0; i < nq; ++i) {
        const float* qi = qs.data() + i * D_;
        float acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t d = 0; d < D_; ++d) acc += qi[d] * row[static_cast<size_t>(d)];
        s[i * ld + (t - t0)] = f * acc;
      }
    }
  }
  void accumulate(int64_t h, const float* p, int nq, int64_t t0, int64_t t1, int64_t ld,
                  float* out) const override {
    if (!pending_.empty())
      return dense_accumulate(pending_.data(), H_, D_, h, p, nq, t0, t1, ld, out);
    std::vector<float> acc(static_cast<size_t>(nq * D_), 0.0f), row(static_cast<size_t>(D_));
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* c = codes_.data() + (t * H_ + h) * D_;
      widen(c, row.data());
      const float f = token_factor(t, h);
      for (int i = 0; i < nq; ++i) {
        const float w = p[i * ld + (t - t0)] * f;
        float* a = acc.data() + i * D_;
#pragma omp simd
        for (int64_t d = 0; d < D_; ++d) a[d] += w * row[static_cast<size_t>(d)];
      }
    }
    const float* cf = channel_factors(h);  // per-channel scales multiply the sum once
    for (int i = 0; i < nq; ++i)
      for (int64_t d = 0; d < D_; ++d)
        out[i * D_ + d] += acc[static_cast<size_t>(i * D_ + d)] * (cf ? cf[d] : 1.0f);
  }
  void exact_tail(std::vector<float>& out) const override {
    out.insert(out.end(), pending_.begin(), pending_.end());
  }
  Tensor3 dequantize() const override {
    Tensor3 y({tokens(), H_, D_});
    if (!pending_.empty()) {
      y.data = pending_;
      return y;
    }
    if (tokens() == 0) return y;
    fp8::dequantize(spec_.fp8(), scales_, codes_, y);
    return y;
  }
  /// \brief Whether the first-N rule applies (dynamic, not per-token).
  bool frozen_rule() const {
    return spec_.fp8().source == ScaleSource::Dynamic && gran_ != Granularity::Token;
  }
  Footprint footprint() const override { return kvq::footprint(spec_, role_, {tokens(), H_, D_}); }
  StoredSide stored() const override {
    if (!pending_.empty()) {  // held exact until `first` tokens have arrived (no scales yet)
      StoredSide s{SchemeKind::Fp32, tokens(), H_, D_};
      s.f32 = pending_.data();
      return s;
    }
    StoredSide s{SchemeKind::Fp8, tokens(), H_, D_};
    s.codes = codes_.data();
    s.fp8_scales = scales_.data();
    s.format = spec_.fp8().format;
    s.gran = gran_;
    s.fp8_nan = nan_;
    return s;
  }

 private:
  SchemeSpec spec_;
  Role role_;
  int64_t H_, D_;
  decltype(SideKernels::fp8_scales) scales_fn_;  // the streaming append's quantize kernels
  decltype(SideKernels::fp8_quantize) quantize_fn_;
  Granularity gran_;
  bool frozen_ = false;
  std::vector<float> pending_;  // exact tokens held until the first-N scales are known
  std::array<float, 256> lut_{};
  std::vector<float> scales_;
  std::vector<uint8_t> codes_;
  bool nan_ = false;  // some code in codes_ is a NaN code
};

std::unique_ptr<SideStore> make(const SchemeSpec& spec, Role role, int64_t heads, int64_t dim,
                                int layer, const SideKernels& kernels) {
  return std::make_unique<Fp8Side>(spec, role, heads, dim, layer, kernels);
}

Tensor3 round_trip(const SchemeSpec& spec, Role role, const Tensor3& x, int layer) {
  const std::vector<float> scales = fp8::prefill_scales(spec.fp8(), role, x, layer);
  std::vector<uint8_t> codes;
  fp8::quantize(spec.fp8(), scales, x, codes);
  Tensor3 y(x.shape);
  fp8::dequantize(spec.fp8(), scales, codes, y);
  return y;
}

// The codes of the first `qt` tokens and their scales (fp8/scale.h's layout for the granularity).
int64_t stored_bytes(const StoredSide& s, int64_t qt, StoredBytes& out) {
  const int64_t H = s.heads, D = s.dim;
  const int64_t ns = qt > 0 ? fp8::scale_count(s.gran, Shape3{qt, H, D}) : 0;
  out.add("codes", "U8", {qt, H, D}, s.codes, qt * H * D);
  out.add("scales", "F32", {ns}, s.fp8_scales, ns * 4);
  out.meta["format"] = std::string(to_string(s.format));
  out.meta["granularity"] = std::string(to_string(s.gran));
  out.meta["layout"] = "codes[t][h][d] is fp8 of x / scale; value = scale * decode(code)";
  return qt;
}

// A tensor quantized at once is its own prefill: dynamic first-N scales come from its first
// min(N, T) tokens, so a short tensor is still quantized.
void whole_tensor(SchemeSpec& spec, int64_t tokens) {
  spec.fp8().first = static_cast<int>(std::min<int64_t>(spec.fp8().first, tokens));
}

}  // namespace

extern const SchemeStorage kFp8Storage;
const SchemeStorage kFp8Storage{"fp8", make, round_trip, stored_bytes, whole_tensor};

}  // namespace kvq
