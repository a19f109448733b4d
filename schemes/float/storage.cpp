// The float family's cache storage (cache/schemes.h): fp32, bf16 and fp16 values as stored
// (bf16 / fp16 as 16-bit patterns). Their reads: schemes/float/reads.cpp.
#include <algorithm>
#include <vector>

#include "cache/schemes.h"
#include "core/error.h"
#include "core/half.h"
#include "core/schemes.h"

namespace kvq {
namespace {

// What the float family's sides share: dense [tokens, heads, dim] values of type T, every token
// stored as its kind's code (fp32: the values themselves).
template <class T>
class DenseSide : public SideStore {
 public:
  DenseSide(SchemeKind kind, int64_t H, int64_t D) : kind_(kind), H_(H), D_(D) {}
  void reserve(int64_t t) override { x_.reserve(static_cast<size_t>(t * H_ * D_)); }
  int64_t tokens() const override { return static_cast<int64_t>(x_.size()) / (H_ * D_); }
  int64_t heads() const override { return H_; }
  int64_t dim() const override { return D_; }
  int64_t quantized_tokens_at(int64_t t) const override { return t; }
  void exact_tail(std::vector<float>&) const override {}
  Footprint footprint() const override {
    return scheme_traits(kind_).stored_footprint(stored(), {tokens(), H_, D_});
  }

 protected:
  SchemeKind kind_;
  int64_t H_, D_;
  std::vector<T> x_;
};

class Fp32Side final : public DenseSide<float> {
 public:
  Fp32Side(int64_t H, int64_t D) : DenseSide(SchemeKind::Fp32, H, D) {}
  void append(const float* x, int64_t n) override { x_.insert(x_.end(), x, x + n * H_ * D_); }
  Tensor3 dequantize() const override {
    Tensor3 y({tokens(), H_, D_});
    y.data = x_;
    return y;
  }
  StoredSide stored() const override {
    StoredSide s{SchemeKind::Fp32, tokens(), H_, D_};
    s.f32 = x_.data();
    return s;
  }
};

// bf16 or fp16 stored as 16-bit patterns.
template <bool kBf16>
class Half16Side final : public DenseSide<uint16_t> {
 public:
  Half16Side(int64_t H, int64_t D) : DenseSide(kBf16 ? SchemeKind::Bf16 : SchemeKind::Fp16, H, D) {}
  static float widen(uint16_t b) { return kBf16 ? bf16_bits_to_float(b) : half_bits_to_float(b); }
  // One growth, then a loop the compiler vectorizes: element by element push_back regrew and
  // copied the vector log2(n) times and kept the conversion scalar (issue 50: bf16's "quantize"
  // baseline in [throughput] ran at a fifth of memcpy, which made every other scheme look fast).
  void append(const float* x, int64_t n) override {
    const size_t old = x_.size(), m = static_cast<size_t>(n * H_ * D_);
    x_.resize(old + m);
    uint16_t* out = x_.data() + old;
    for (size_t i = 0; i < m; ++i)
      out[i] = kBf16 ? float_to_bf16_bits(x[i]) : float_to_half_bits(x[i]);
  }
  Tensor3 dequantize() const override {
    Tensor3 y({tokens(), H_, D_});
    for (size_t i = 0; i < x_.size(); ++i) y.data[i] = widen(x_[i]);
    return y;
  }
  StoredSide stored() const override {
    StoredSide s{kind_, tokens(), H_, D_};
    s.half16 = x_.data();
    return s;
  }
};

std::unique_ptr<SideStore> make(const SchemeSpec& spec, Role, int64_t heads, int64_t dim, int,
                                const SideKernels&) {
  switch (spec.kind()) {
    case SchemeKind::Bf16:
      return std::make_unique<Half16Side<true>>(heads, dim);
    case SchemeKind::Fp16:
      return std::make_unique<Half16Side<false>>(heads, dim);
    default:
      return std::make_unique<Fp32Side>(heads, dim);
  }
}

Tensor3 round_trip(const SchemeSpec& spec, Role, const Tensor3& x, int) {
  Tensor3 y = x;
  if (spec.kind() == SchemeKind::Bf16)
    for (float& v : y.data) v = round_to_bf16(v);
  else if (spec.kind() == SchemeKind::Fp16)
    for (float& v : y.data) v = round_to_half(v);
  return y;
}

// Every token's values as stored: F32, or the 16-bit patterns as BF16 / F16.
int64_t stored_bytes(const StoredSide& s, int64_t, StoredBytes& out) {
  const int64_t n = s.tokens * s.heads * s.dim;
  if (s.kind == SchemeKind::Fp32)
    out.add("values", "F32", {s.tokens, s.heads, s.dim}, s.f32, n * 4);
  else
    out.add("values", s.kind == SchemeKind::Bf16 ? "BF16" : "F16", {s.tokens, s.heads, s.dim},
            s.half16, n * 2);
  return s.tokens;
}

}  // namespace

extern const SchemeStorage kFloatStorage;
const SchemeStorage kFloatStorage{"float", make, round_trip, stored_bytes};

}  // namespace kvq
