#include "cache/side.h"

#include <algorithm>
#include <vector>

#include "cache/schemes.h"
#include "core/error.h"

namespace kvq {
namespace {

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

// rot=: the inner side stores R x; exact values and dequantize are un-rotated (readers of
// stored() rotate q and un-rotate outputs by rotation()).
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

std::unique_ptr<SideStore> make_side(const SchemeSpec& whole, Role role, int64_t heads, int64_t dim,
                                     int layer, const SideKernels& kernels) {
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
  return scheme_storage(spec.kind()).make_side(spec, role, heads, dim, layer, kernels);
}

std::unique_ptr<SideStore> make_side(const SchemeSpec& spec, Role role, const Tensor3& x,
                                     int layer) {
  // A tensor quantized at once is its own prefill (the family's whole_tensor).
  SchemeSpec sp = spec.for_layer(layer).side(role);
  const int64_t own = x.shape.tokens - std::min<int64_t>(sp.sink, x.shape.tokens);  // after sinks
  const SchemeStorage& storage = scheme_storage(sp.kind());
  if (storage.whole_tensor && own > 0) storage.whole_tensor(sp, own);
  auto s = make_side(sp, role, x.shape.heads, x.shape.dim, layer);
  s->append(x.data.data(), x.shape.tokens);
  return s;
}

}  // namespace kvq
