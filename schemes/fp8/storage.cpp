// The fp8 family's cache storage (cache/schemes.h): one code per element + scales (token scales
// grow per token; tensor/head/channel dynamic scales are computed from the first `first` tokens -
// the prefill - and then frozen, as vLLM's calculate-kv-scales; constant and calib scales are
// fixed). Its reads: schemes/fp8/reads.cpp.
#include <algorithm>
#include <vector>

#include "cache/schemes.h"
#include "core/error.h"
#include "fp8/scale.h"

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
