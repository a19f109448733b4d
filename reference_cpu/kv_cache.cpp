#include "reference_cpu/kv_cache.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "fp8/scale.h"
#include "reference_cpu/dense_ops.h"
#include "reference_cpu/int_side.h"

namespace kvq {
namespace {

// ---- dense: fp32, bf16, fp16 ----------------------------------------------------------------

class Fp32Side final : public SideStore {
 public:
  Fp32Side(int64_t H, int64_t D) : H_(H), D_(D) {}
  void append(const float* x, int64_t n) override { x_.insert(x_.end(), x, x + n * H_ * D_); }
  void reserve(int64_t t) override { x_.reserve(static_cast<size_t>(t * H_ * D_)); }
  int64_t tokens() const override { return static_cast<int64_t>(x_.size()) / (H_ * D_); }
  int64_t heads() const override { return H_; }
  int64_t dim() const override { return D_; }
  int64_t quantized_tokens_at(int64_t t) const override { return t; }
  void dot(int64_t h, const float* q, int nq, int64_t t0, int64_t t1, float* s,
           int64_t ld) const override {
    dense_dot(x_.data(), H_, D_, h, q, nq, t0, t1, s, ld);
  }
  void accumulate(int64_t h, const float* p, int nq, int64_t t0, int64_t t1, int64_t ld,
                  float* out) const override {
    dense_accumulate(x_.data(), H_, D_, h, p, nq, t0, t1, ld, out);
  }
  void exact_tail(std::vector<float>&) const override {}
  Tensor3 dequantize() const override {
    Tensor3 y({tokens(), H_, D_});
    y.data = x_;
    return y;
  }
  Footprint footprint() const override {
    return kvq::footprint(parse_spec("fp32"), Role::Key, {tokens(), H_, D_});
  }
  StoredSide stored() const override {
    StoredSide s{SchemeKind::Fp32, tokens(), H_, D_};
    s.f32 = x_.data();
    return s;
  }

 private:
  int64_t H_, D_;
  std::vector<float> x_;
};

// bf16 or fp16 stored as 16-bit patterns; widened in registers.
template <bool kBf16>
class Half16Side final : public SideStore {
 public:
  Half16Side(int64_t H, int64_t D) : H_(H), D_(D) {}
  static float widen(uint16_t b) { return kBf16 ? bf16_bits_to_float(b) : half_bits_to_float(b); }
  void reserve(int64_t t) override { x_.reserve(static_cast<size_t>(t * H_ * D_)); }
  // One growth, then a loop the compiler vectorizes: element by element push_back regrew and
  // copied the vector log2(n) times and kept the conversion scalar (issue 50: bf16's "quantize"
  // baseline in [throughput] ran at a fifth of memcpy, which made every other scheme look fast).
  void append(const float* x, int64_t n) override {
    const size_t old = x_.size(), m = static_cast<size_t>(n * H_ * D_);
    x_.resize(old + m);
    uint16_t* out = x_.data() + old;
    for (size_t i = 0; i < m; ++i) out[i] = kBf16 ? float_to_bf16_bits(x[i]) : float_to_half_bits(x[i]);
  }
  int64_t tokens() const override { return static_cast<int64_t>(x_.size()) / (H_ * D_); }
  int64_t heads() const override { return H_; }
  int64_t dim() const override { return D_; }
  int64_t quantized_tokens_at(int64_t t) const override { return t; }
  void dot(int64_t h, const float* q, int nq, int64_t t0, int64_t t1, float* s,
           int64_t ld) const override {
    std::vector<float> row(static_cast<size_t>(D_));
    for (int64_t t = t0; t < t1; ++t) {
      const uint16_t* r = x_.data() + (t * H_ + h) * D_;
      for (int64_t d = 0; d < D_; ++d) row[static_cast<size_t>(d)] = widen(r[d]);
      for (int i = 0; i < nq; ++i) {
        const float* qi = q + i * D_;
        float acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t d = 0; d < D_; ++d) acc += qi[d] * row[static_cast<size_t>(d)];
        s[i * ld + (t - t0)] = acc;
      }
    }
  }
  void accumulate(int64_t h, const float* p, int nq, int64_t t0, int64_t t1, int64_t ld,
                  float* out) const override {
    std::vector<float> row(static_cast<size_t>(D_));
    for (int64_t t = t0; t < t1; ++t) {
      const uint16_t* r = x_.data() + (t * H_ + h) * D_;
      for (int64_t d = 0; d < D_; ++d) row[static_cast<size_t>(d)] = widen(r[d]);
      for (int i = 0; i < nq; ++i) {
        const float w = p[i * ld + (t - t0)];
        float* o = out + i * D_;
#pragma omp simd
        for (int64_t d = 0; d < D_; ++d) o[d] += w * row[static_cast<size_t>(d)];
      }
    }
  }
  void exact_tail(std::vector<float>&) const override {}
  Tensor3 dequantize() const override {
    Tensor3 y({tokens(), H_, D_});
    for (size_t i = 0; i < x_.size(); ++i) y.data[i] = widen(x_[i]);
    return y;
  }
  Footprint footprint() const override {
    return kvq::footprint(parse_spec(kBf16 ? "bf16" : "fp16"), Role::Key, {tokens(), H_, D_});
  }
  StoredSide stored() const override {
    StoredSide s{kBf16 ? SchemeKind::Bf16 : SchemeKind::Fp16, tokens(), H_, D_};
    s.half16 = x_.data();
    return s;
  }

 private:
  int64_t H_, D_;
  std::vector<uint16_t> x_;
};

// ---- fp8 -------------------------------------------------------------------------------------

class Fp8Side final : public SideStore {
 public:
  Fp8Side(const SchemeSpec& spec, Role role, int64_t H, int64_t D, int layer,
          const SideKernels& k)
      : spec_(spec),
        role_(role),
        H_(H),
        D_(D),
        scales_fn_(k.fp8_scales ? k.fp8_scales : fp8::compute_scales),
        quantize_fn_(k.fp8_quantize ? k.fp8_quantize : fp8::quantize) {
    const Fp8Spec& f = spec.fp8;
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
      const auto s = scales_fn_(spec_.fp8, role_, chunk, 0);  // per (token, head): streaming-safe
      scales_.insert(scales_.end(), s.begin(), s.end());
      std::vector<uint8_t> c;
      quantize_fn_(spec_.fp8, s, chunk, c);
      keep_codes(std::move(c));
      return;
    }
    if (!frozen_) {
      // Dynamic tensor / head / channel scales: held exact until `first` tokens have arrived, then
      // the scales come from exactly those tokens, whatever the chunking (spec.h).
      pending_.insert(pending_.end(), x, x + n * H_ * D_);
      const int64_t held = static_cast<int64_t>(pending_.size()) / (H_ * D_);
      if (held < spec_.fp8.first) return;
      chunk.shape = {held, H_, D_};
      chunk.data = std::move(pending_);
      pending_.clear();
      scales_ = fp8::prefill_scales(spec_.fp8, role_, chunk);  // from the first `first` tokens
      frozen_ = true;
    }
    std::vector<uint8_t> c;
    quantize_fn_(spec_.fp8, scales_, chunk, c);
    keep_codes(std::move(c));
  }
  // Appends a chunk's codes; the first chunk's vector is taken over unless reserve() made room.
  void keep_codes(std::vector<uint8_t>&& c) {
    nan_ = nan_ || fp8::any_nan_code(spec_.fp8.format, c.data(), static_cast<int64_t>(c.size()));
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
    return frozen_rule() && t < spec_.fp8.first ? 0 : t;
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
    fp8::dequantize(spec_.fp8, scales_, codes_, y);
    return y;
  }
  /// \brief Whether the first-N rule applies (dynamic, not per-token).
  bool frozen_rule() const {
    return spec_.fp8.source == ScaleSource::Dynamic && gran_ != Granularity::Token;
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
    s.format = spec_.fp8.format;
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

// Fixed fp32 values with another side's window rule.
class ViewSide final : public SideStore {
 public:
  ViewSide(const SideStore& base, Tensor3 values) : base_(base), x_(std::move(values)) {
    KVQ_CHECK(x_.shape == (Shape3{base.tokens(), base.heads(), base.dim()}),
              "make_view: shape mismatch");
  }
  void append(const float*, int64_t) override { fail("make_view: a view is read-only"); }
  int64_t tokens() const override { return x_.shape.tokens; }
  int64_t heads() const override { return x_.shape.heads; }
  int64_t dim() const override { return x_.shape.dim; }
  int64_t quantized_tokens_at(int64_t t) const override { return base_.quantized_tokens_at(t); }
  void dot(int64_t h, const float* q, int nq, int64_t t0, int64_t t1, float* s,
           int64_t ld) const override {
    dense_dot(x_.data.data(), heads(), dim(), h, q, nq, t0, t1, s, ld);
  }
  void accumulate(int64_t h, const float* p, int nq, int64_t t0, int64_t t1, int64_t ld,
                  float* out) const override {
    dense_accumulate(x_.data.data(), heads(), dim(), h, p, nq, t0, t1, ld, out);
  }
  void exact_tail(std::vector<float>& out) const override { base_.exact_tail(out); }
  Tensor3 dequantize() const override { return x_; }
  Footprint footprint() const override { return base_.footprint(); }
  StoredSide stored() const override {
    StoredSide s{SchemeKind::Fp32, tokens(), heads(), dim()};
    s.f32 = x_.data.data();
    const int64_t S = base_.stored().sink_tokens;  // the base's sinks: the same rows, split off
    if (S > 0) {
      s.sink = s.f32;
      s.sink_tokens = S;
      s.f32 += S * heads() * dim();
    }
    return s;
  }

 private:
  const SideStore& base_;
  Tensor3 x_;
};

// sink=S: the first S tokens exact (fp32) in front of the scheme's own side, which holds the
// tokens from S on (its token 0 is the sequence's token S).
class SinkSide final : public SideStore {
 public:
  SinkSide(int64_t sinks, std::unique_ptr<SideStore> inner)
      : S_(sinks), in_(std::move(inner)), H_(in_->heads()), D_(in_->dim()) {}
  void append(const float* x, int64_t n) override {
    const int64_t row = H_ * D_, take = std::min(n, S_ - held());
    if (take > 0) sink_.insert(sink_.end(), x, x + take * row);
    if (n > take) in_->append(x + take * row, n - take);
  }
  void reserve(int64_t t) override {
    sink_.reserve(static_cast<size_t>(S_ * H_ * D_));
    in_->reserve(std::max<int64_t>(t - S_, 0));
  }
  int64_t tokens() const override { return held() + in_->tokens(); }
  int64_t heads() const override { return H_; }
  int64_t dim() const override { return D_; }
  int64_t quantized_tokens_at(int64_t t) const override {
    return t <= S_ ? t : S_ + in_->quantized_tokens_at(t - S_);
  }
  void dot(int64_t h, const float* q, int nq, int64_t t0, int64_t t1, float* s,
           int64_t ld) const override {
    const int64_t m = std::clamp(S_, t0, t1);
    if (m > t0) dense_dot(sink_.data(), H_, D_, h, q, nq, t0, m, s, ld);
    if (t1 > m) in_->dot(h, q, nq, m - S_, t1 - S_, s + (m - t0), ld);
  }
  void accumulate(int64_t h, const float* p, int nq, int64_t t0, int64_t t1, int64_t ld,
                  float* out) const override {
    const int64_t m = std::clamp(S_, t0, t1);
    if (m > t0) dense_accumulate(sink_.data(), H_, D_, h, p, nq, t0, m, ld, out);
    if (t1 > m) in_->accumulate(h, p + (m - t0), nq, m - S_, t1 - S_, ld, out);
  }
  void exact_tail(std::vector<float>& out) const override { in_->exact_tail(out); }
  Tensor3 dequantize() const override {
    Tensor3 y({tokens(), H_, D_});
    std::copy(sink_.begin(), sink_.end(), y.data.begin());
    if (in_->tokens() > 0) {
      const Tensor3 r = in_->dequantize();
      std::copy(r.data.begin(), r.data.end(), y.data.begin() + static_cast<int64_t>(sink_.size()));
    }
    return y;
  }
  Footprint footprint() const override {
    Footprint f = in_->footprint();
    add_exact(f, static_cast<int64_t>(sink_.size()));
    return f;
  }
  StoredSide stored() const override {
    StoredSide s = in_->stored();
    s.tokens += held();
    s.sink = sink_.data();
    s.sink_tokens = held();
    return s;
  }

 private:
  int64_t held() const { return static_cast<int64_t>(sink_.size()) / (H_ * D_); }
  int64_t S_;
  std::unique_ptr<SideStore> in_;
  int64_t H_, D_;
  std::vector<float> sink_;
};

// rot=: the inner side stores R x; reads rotate q, un-rotate outputs and exact values.
class RotatedSide final : public SideStore {
 public:
  RotatedSide(const RotSpec& r, std::unique_ptr<SideStore> inner)
      : in_(std::move(inner)), rot_(r, in_->dim()), D_(in_->dim()) {}
  void append(const float* x, int64_t n) override {
    buf_.assign(x, x + n * in_->heads() * D_);
    rot_.rotate(buf_.data(), n * in_->heads());
    in_->append(buf_.data(), n);
  }
  void reserve(int64_t t) override { in_->reserve(t); }
  int64_t tokens() const override { return in_->tokens(); }
  int64_t heads() const override { return in_->heads(); }
  int64_t dim() const override { return D_; }
  int64_t quantized_tokens_at(int64_t t) const override { return in_->quantized_tokens_at(t); }
  void dot(int64_t h, const float* q, int nq, int64_t t0, int64_t t1, float* s,
           int64_t ld) const override {
    std::vector<float> rq(q, q + nq * D_);
    rot_.rotate(rq.data(), nq);
    in_->dot(h, rq.data(), nq, t0, t1, s, ld);
  }
  void accumulate(int64_t h, const float* p, int nq, int64_t t0, int64_t t1, int64_t ld,
                  float* out) const override {
    std::vector<float> o(static_cast<size_t>(nq * D_), 0.0f);
    in_->accumulate(h, p, nq, t0, t1, ld, o.data());
    rot_.unrotate(o.data(), nq);
    for (size_t i = 0; i < o.size(); ++i) out[i] += o[i];
  }
  void exact_tail(std::vector<float>& out) const override {
    const size_t before = out.size();
    in_->exact_tail(out);
    rot_.unrotate(out.data() + before, static_cast<int64_t>(out.size() - before) / D_);
  }
  void stored_exact_tail(std::vector<float>& out) const override { in_->exact_tail(out); }
  Tensor3 dequantize() const override {
    Tensor3 y = in_->dequantize();
    rot_.unrotate(y.data.data(), y.shape.tokens * y.shape.heads);
    return y;
  }
  Footprint footprint() const override { return in_->footprint(); }
  StoredSide stored() const override { return in_->stored(); }
  const Rotation* rotation() const override { return &rot_; }

 private:
  std::unique_ptr<SideStore> in_;
  Rotation rot_;
  int64_t D_;
  std::vector<float> buf_;
};

}  // namespace

StoredSide SideStore::stored() const { fail("this cache side exposes no stored bytes"); }

std::unique_ptr<SideStore> make_view(const SideStore& base, Tensor3 values) {
  return std::make_unique<ViewSide>(base, std::move(values));
}

int64_t gather_exact_tail(const SideStore& s, const float* x, int64_t n, std::vector<float>& tail,
                          TailSpace space) {
  const bool stored_space = space == TailSpace::kStored;
  const int64_t row = s.heads() * s.dim();
  tail.clear();
  if (stored_space)
    s.stored_exact_tail(tail);
  else
    s.exact_tail(tail);
  const int64_t begin = s.tokens() - static_cast<int64_t>(tail.size()) / row;
  const size_t old = tail.size();
  tail.insert(tail.end(), x, x + n * row);
  if (const Rotation* r = s.rotation()) {
    // A rot= side stores R x and gives back R^T (R x): the chunk's rows read the same way as the
    // side's tail will in a later call, so a token reads the same bits in any chunking.
    r->rotate(tail.data() + old, n * s.heads());
    if (!stored_space) r->unrotate(tail.data() + old, n * s.heads());
  }
  return begin;
}

std::unique_ptr<SideStore> make_side(const SchemeSpec& whole, Role role, int64_t heads,
                                     int64_t dim, int layer, const SideKernels& kernels) {
  if (whole.layered()) return make_side(whole.for_layer(layer), role, heads, dim, layer, kernels);
  const SchemeSpec& spec = whole.side(role);
  KVQ_CHECK(heads > 0 && dim > 0, "cache shape: heads {} and head_dim {} must be positive", heads,
            dim);
  if (spec.rot.on || spec.sink > 0) {
    // Rotation outermost, so the sinks hold rotated vectors like every other token and one
    // rotated query reads them all (backend cpu attends the sinks and the codes in one pass).
    std::unique_ptr<SideStore> s = make_side(spec.base(), role, heads, dim, layer, kernels);
    if (spec.sink > 0) s = std::make_unique<SinkSide>(spec.sink, std::move(s));
    if (spec.rot.on) s = std::make_unique<RotatedSide>(spec.rot, std::move(s));
    return s;
  }
  switch (spec.kind) {
    case SchemeKind::Fp32:
      return std::make_unique<Fp32Side>(heads, dim);
    case SchemeKind::Bf16:
      return std::make_unique<Half16Side<true>>(heads, dim);
    case SchemeKind::Fp16:
      return std::make_unique<Half16Side<false>>(heads, dim);
    case SchemeKind::Fp8:
      return std::make_unique<Fp8Side>(spec, role, heads, dim, layer, kernels);
    case SchemeKind::Int:
      return make_int_side(spec, role, heads, dim, kernels.kivi);
  }
  fail("make_side: unknown scheme kind");
}

std::unique_ptr<SideStore> make_side(const SchemeSpec& spec, Role role, const Tensor3& x,
                                     int layer) {
  // A tensor quantized at once is its own prefill: dynamic first-N scales come from its first
  // min(N, T) tokens, so a short tensor is still quantized.
  SchemeSpec sp = spec.for_layer(layer).side(role);
  const int64_t own = x.shape.tokens - std::min<int64_t>(sp.sink, x.shape.tokens);  // after sinks
  if (sp.kind == SchemeKind::Fp8 && own > 0)
    sp.fp8.first = static_cast<int>(std::min<int64_t>(sp.fp8.first, own));
  auto s = make_side(sp, role, x.shape.heads, x.shape.dim, layer);
  s->append(x.data.data(), x.shape.tokens);
  return s;
}

}  // namespace kvq
