#include "kivi/cache.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kivi/group.h"

namespace kvq::kivi {
namespace {

// The stored code of a value whose clamped quotient is q, in a group with zero point z and scale
// s: exactly encode() of kivi/minmax.h, as branch-free arithmetic plus the rare tie fix-up.
template <int B, bool S>
uint32_t code_of(float x, float z, float s, float q) {
  const float k = on_tie(q) ? resolve_tie(x, z, s, q) : round_half_even(q);
  return static_cast<uint32_t>(static_cast<int>(k) + (S ? sym_offset(B) : 0));
}

// One token group of the per-channel side, batched over its `cols` = H*D groups: element i of
// group c is x[i * cols + c]. The same functions as quantize_group (kivi/group.h), arranged so
// that every inner loop runs over contiguous columns and vectorizes; a code whose float quotient
// sits on a tie is redone exactly afterwards (rare). Writes words[c * words_for(n, B) + w],
// scales[c], mins[c] (asym). fs: 5 * cols floats, us: 2 * cols words of scratch.
template <int B, bool S>
void quantize_columns(const float* x, int64_t cols, int n, uint32_t* words, uint16_t* scales,
                      uint16_t* mins, float* fs, uint32_t* us) {
  constexpr int kCpw = codes_per_word(B);
  constexpr float kLo = quotient_lo(B, S), kHi = quotient_hi(B, S);
  constexpr uint32_t kZero = zero_code(B, S), kOff = S ? sym_offset(B) : 0;
  float *mn = fs, *mx = fs + cols, *nf = fs + 2 * cols, *z = fs + 3 * cols, *s = fs + 4 * cols;
  uint32_t *valid = us, *acc = us + cols;
  for (int64_t c = 0; c < cols; ++c) {
    mn[c] = mx[c] = x[c];
    nf[c] = x[c] * 0.0f;  // stays 0 while every value is finite, NaN otherwise
  }
  for (int i = 1; i < n; ++i) {
    const float* row = x + i * cols;
    for (int64_t c = 0; c < cols; ++c) {
      mn[c] = min_step(row[c], mn[c]);
      mx[c] = max_step(row[c], mx[c]);
      nf[c] += row[c] * 0.0f;
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    GroupRange r;
    r.mn = mn[c];
    r.mx = mx[c];
    r.finite = nf[c] == 0.0f;
    const GroupParams p = minmax_params(r, B, S);
    scales[c] = p.scale_h;
    if (!S) mins[c] = p.min_h;
    const bool ok = p.scale > 0.0f;  // else every code is the zero code
    z[c] = ok && !S ? p.min : 0.0f;
    s[c] = ok ? p.scale : 1.0f;
    valid[c] = ok ? ~0u : 0u;
  }
  const int64_t wpg = words_for(n, B);
  for (int64_t w = 0; w < wpg; ++w) {
    for (int64_t c = 0; c < cols; ++c) acc[c] = 0;
    for (int i = static_cast<int>(w) * kCpw; i < n && i < (static_cast<int>(w) + 1) * kCpw; ++i) {
      const float* row = x + i * cols;
      const int sh = shift_of(i, B);
      uint32_t ties = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const float q = clamped_quotient(row[c], z[c], s[c], kLo, kHi);
        const uint32_t k = static_cast<uint32_t>(static_cast<int>(round_half_even(q))) + kOff;
        acc[c] |= ((k & valid[c]) | (kZero & ~valid[c])) << sh;
        ties |= static_cast<uint32_t>(on_tie(q)) & valid[c];
      }
      if (ties) {
        for (int64_t c = 0; c < cols; ++c) {
          const float q = clamped_quotient(row[c], z[c], s[c], kLo, kHi);
          if (!valid[c] || !on_tie(q)) continue;
          acc[c] = (acc[c] & ~(code_mask(B) << sh)) | (code_of<B, S>(row[c], z[c], s[c], q) << sh);
        }
      }
    }
    for (int64_t c = 0; c < cols; ++c) words[c * wpg + w] = acc[c];
  }
}

// One (token, head) of the per-token side: ceil(dim / G) groups of G contiguous channels, the
// last one possibly shorter. The same functions as quantize_group (kivi/group.h); the min / max
// runs in 8 lanes (min and max do not depend on the order, minmax_params takes zeros as +0).
// Writes words[c * words_for(G, B) + w], scales[c], mins[c] (asym).
template <int B, bool S>
void quantize_row(const float* x, int64_t dim, int group, uint32_t* words, uint16_t* scales,
                  uint16_t* mins) {
  constexpr int kCpw = codes_per_word(B), kLanes = 8, kChunk = kCpw * (64 / kCpw);
  constexpr float kLo = quotient_lo(B, S), kHi = quotient_hi(B, S);
  constexpr uint32_t kOff = S ? sym_offset(B) : 0;
  const int64_t wpg = words_for(group, B);
  for (int64_t c0 = 0, cg = 0; c0 < dim; c0 += group, ++cg) {
    const float* g = x + c0;
    const int len = static_cast<int>(dim - c0 < group ? dim - c0 : group);
    float mn[kLanes], mx[kLanes], nf[kLanes];
    for (int j = 0; j < kLanes; ++j) mn[j] = mx[j] = g[0], nf[j] = 0.0f;
    int i = 0;
    for (; i + kLanes <= len; i += kLanes)
      for (int j = 0; j < kLanes; ++j) {
        mn[j] = min_step(g[i + j], mn[j]);
        mx[j] = max_step(g[i + j], mx[j]);
        nf[j] += g[i + j] * 0.0f;
      }
    for (; i < len; ++i) {
      mn[0] = min_step(g[i], mn[0]);
      mx[0] = max_step(g[i], mx[0]);
      nf[0] += g[i] * 0.0f;
    }
    GroupRange r;
    r.mn = mn[0];
    r.mx = mx[0];
    float bad = nf[0];
    for (int j = 1; j < kLanes; ++j) {
      r.mn = min_step(mn[j], r.mn);
      r.mx = max_step(mx[j], r.mx);
      bad += nf[j];
    }
    r.finite = bad == 0.0f;
    const GroupParams p = minmax_params(r, B, S);
    scales[cg] = p.scale_h;
    if (!S) mins[cg] = p.min_h;
    // Codes in chunks of whole words: one long vectorizable loop, then pack (kivi/pack.h).
    const bool ok = p.scale > 0.0f;  // else every code is the zero code
    const float z = ok && !S ? p.min : 0.0f, s = ok ? p.scale : 1.0f;
    uint32_t codes[kChunk];
    for (int k0 = 0; k0 < len; k0 += kChunk) {
      const int m = len - k0 < kChunk ? len - k0 : kChunk;
      const float* v = g + k0;
      uint32_t ties = 0;
      for (int k = 0; k < m; ++k) {
        const float q = clamped_quotient(v[k], z, s, kLo, kHi);
        codes[k] = static_cast<uint32_t>(static_cast<int>(round_half_even(q))) + kOff;
        ties |= static_cast<uint32_t>(on_tie(q));
      }
      if (!ok) {
        for (int k = 0; k < m; ++k) codes[k] = zero_code(B, S);
      } else if (ties) {
        for (int k = 0; k < m; ++k) {
          const float q = clamped_quotient(v[k], z, s, kLo, kHi);
          if (on_tie(q)) codes[k] = code_of<B, S>(v[k], z, s, q);
        }
      }
      pack(codes, m, B, words + cg * wpg + k0 / kCpw);
    }
  }
}

}  // namespace

SideCache::SideCache(const IntSpec& spec, Role role, int64_t heads, int64_t head_dim,
                     const GroupQuantizers& quantizers)
    : spec_(spec),
      role_(role),
      axis_(spec.axis(role)),
      heads_(heads),
      dim_(head_dim),
      quant_(quantizers) {
  const int b = spec.bits;
  KVQ_CHECK(b == 2 || b == 3 || b == 4 || b == 8,
            "kivi: {} bits not supported (allowed: 2, 3, 4, 8)", b);
  KVQ_CHECK(heads >= 1 && head_dim >= 1, "kivi: cache shape heads={} head_dim={} must be >= 1",
            heads, head_dim);
  KVQ_CHECK(spec.residual >= 0, "kivi: residual window r={} must be >= 0", spec.residual);
  const char* side = axis_ == Axis::Channel ? "per-channel" : "per-token";
  if (axis_ == Axis::Channel) {
    KVQ_CHECK(spec.group != kGroupWholeDim,
              "kivi: g=dim groups channels, but the per-channel side ({}) groups tokens; give g=G",
              to_string(role));
  }
  group_ = spec.group_for(head_dim);
  KVQ_CHECK(group_ >= 1, "kivi: group g={} must be >= 1", group_);
  if (axis_ == Axis::Token) {
    KVQ_CHECK(group_ <= head_dim,
              "kivi: group g={} is larger than what it groups: head_dim {} channels on the {} "
              "side ({})",
              group_, head_dim, side, to_string(role));
  } else {
    KVQ_CHECK(spec.residual % group_ == 0,
              "kivi: r={} must be a multiple of g={} on the {} side ({})", spec.residual, group_,
              side, to_string(role));
  }
  KVQ_CHECK(!(spec.sym && spec.arith == Arith::Fp16),
            "kivi: arith=fp16 is KIVI's asymmetric arithmetic; it has no sym form");
  row_ = heads_ * dim_;
}

ChannelLayout SideCache::channel_layout() const {
  return ChannelLayout{heads_, dim_, group_, spec_.bits};
}

TokenLayout SideCache::token_layout() const {
  return TokenLayout{heads_, dim_, group_, spec_.bits};
}

void SideCache::append(const float* x, int64_t n) {
  KVQ_CHECK(n >= 0, "kivi: append of n={} tokens (must be >= 0)", n);
  if (n == 0) return;
  KVQ_CHECK(x != nullptr, "kivi: append of n={} tokens from a null pointer", n);
  // The one append policy (kivi/append_plan.h), carried out step by step.
  const AppendPlan p = append_rule().plan(tokens_, n);
  push_residual(x, p.topup);
  quantize(residual_row(0), p.from_window);
  drop_residual(p.from_window);
  quantize(x + p.topup * row_, p.from_x);
  push_residual(x + p.kept_from() * row_, n - p.kept_from());
  tokens_ = p.tokens;
  KVQ_CHECK(quantized_ == p.quantized && resid_count_ == p.tokens - p.quantized,
            "kivi: internal error: {} quantized + {} residual tokens after an append, expected {}",
            quantized_, resid_count_, p.quantized);
}

void SideCache::quantize(const float* src, int64_t count) {
  if (axis_ == Axis::Channel)
    quantize_channel_blocks(src, count);
  else
    quantize_token_rows(src, count);
}

// Quantizes `count` (a multiple of G) tokens src[count, H, D] as count / G token groups per
// (head, channel), appended after the groups already stored.
void SideCache::quantize_channel_blocks(const float* src, int64_t count) {
  if (count <= 0) return;
  const ChannelLayout lay = channel_layout();
  const int64_t g0 = quantized_ / group_, ng = count / group_;
  words_.resize(static_cast<size_t>(lay.words_for_tokens(quantized_ + count)));
  scales_.resize(static_cast<size_t>(lay.params_for_tokens(quantized_ + count)));
  if (!spec_.sym) mins_.resize(scales_.size());
  if (spec_.arith == Arith::Fp16) {  // KIVI's arithmetic: one group at a time, every backend
    for (int64_t g = g0; g < g0 + ng; ++g)
      for (int64_t c = 0; c < row_; ++c) {
        const int64_t p = lay.param_index(g, c / dim_, c % dim_);
        quantize_group_fp16(src + (g - g0) * group_ * row_ + c, row_, group_, spec_.bits,
                            words_.data() + lay.word_index(g, c / dim_, c % dim_),
                            scales_.data() + p, mins_.data() + p);
      }
    quantized_ += count;
    return;
  }
  if (quant_.columns) {
    for (int64_t g = g0; g < g0 + ng; ++g) {
      const int64_t p0 = lay.param_index(g, 0, 0);
      quant_.columns(src + (g - g0) * group_ * row_, row_, group_, spec_.bits, spec_.sym,
                     words_.data() + lay.word_index(g, 0, 0), scales_.data() + p0,
                     spec_.sym ? nullptr : mins_.data() + p0);
    }
    quantized_ += count;
    return;
  }
  fscratch_.resize(static_cast<size_t>(5 * row_));
  uscratch_.resize(static_cast<size_t>(2 * row_));
  dispatch_bits(spec_.bits, spec_.sym, [&]<int B, bool S>() {
    for (int64_t g = g0; g < g0 + ng; ++g) {
      const int64_t p0 = lay.param_index(g, 0, 0);
      quantize_columns<B, S>(src + (g - g0) * group_ * row_, row_, group_,
                             words_.data() + lay.word_index(g, 0, 0), scales_.data() + p0,
                             S ? nullptr : mins_.data() + p0, fscratch_.data(), uscratch_.data());
    }
  });
  quantized_ += count;
}

// Quantizes `count` tokens src[count, H, D], each (token, head) in ceil(D / G) channel groups.
void SideCache::quantize_token_rows(const float* src, int64_t count) {
  if (count <= 0) return;
  const TokenLayout lay = token_layout();
  words_.resize(static_cast<size_t>(lay.words_for_tokens(quantized_ + count)));
  scales_.resize(static_cast<size_t>(lay.params_for_tokens(quantized_ + count)));
  if (!spec_.sym) mins_.resize(scales_.size());
  if (spec_.arith == Arith::Fp16) {  // KIVI's arithmetic: one group at a time, every backend
    for (int64_t t = quantized_; t < quantized_ + count; ++t)
      for (int64_t h = 0; h < heads_; ++h)
        for (int64_t c = 0; c * group_ < dim_; ++c) {
          const int64_t p = lay.param_index(t, h, c);
          quantize_group_fp16(src + (t - quantized_) * row_ + h * dim_ + c * group_, 1,
                              lay.group_len(c), spec_.bits, words_.data() + lay.word_index(t, h, c),
                              scales_.data() + p, mins_.data() + p);
        }
    quantized_ += count;
    return;
  }
  if (quant_.row) {
    // When G divides D the rows' groups follow each other in the layout: one row of them.
    const int64_t rows = dim_ % group_ == 0 ? 1 : count * heads_;
    const int64_t len = dim_ % group_ == 0 ? count * row_ : dim_;
    const int64_t t0 = quantized_;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = t0 + r / heads_, h = r % heads_;
      const int64_t p0 = lay.param_index(t, h, 0);
      quant_.row(src + r * dim_, len, group_, spec_.bits, spec_.sym,
                 words_.data() + lay.word_index(t, h, 0), scales_.data() + p0,
                 spec_.sym ? nullptr : mins_.data() + p0);
    }
    quantized_ += count;
    return;
  }
  dispatch_bits(spec_.bits, spec_.sym, [&]<int B, bool S>() {
    for (int64_t t = quantized_; t < quantized_ + count; ++t)
      for (int64_t h = 0; h < heads_; ++h) {
        const int64_t p0 = lay.param_index(t, h, 0);
        quantize_row<B, S>(src + (t - quantized_) * row_ + h * dim_, dim_, group_,
                           words_.data() + lay.word_index(t, h, 0), scales_.data() + p0,
                           S ? nullptr : mins_.data() + p0);
      }
  });
  quantized_ += count;
}

void SideCache::push_residual(const float* src, int64_t count) {
  if (count <= 0) return;
  if (resid_start_ > 0 && resid_start_ >= resid_count_) {  // reclaim the dead prefix
    std::memmove(resid_.data(), residual_row(0), sizeof(float) * resid_count_ * row_);
    resid_start_ = 0;
    resid_.resize(static_cast<size_t>(resid_count_ * row_));
  }
  resid_.insert(resid_.end(), src, src + count * row_);
  resid_count_ += count;
}

void SideCache::drop_residual(int64_t count) {
  if (count <= 0) return;
  resid_start_ += count;
  resid_count_ -= count;
  if (resid_count_ == 0) {
    resid_start_ = 0;
    resid_.clear();
  }
}

Tensor3 SideCache::dequantize() const {
  Tensor3 out(Shape3{tokens_, heads_, dim_});
  const int b = spec_.bits;
  const bool sym = spec_.sym;
  if (axis_ == Axis::Channel) {
    const ChannelLayout lay = channel_layout();
    for (int64_t g = 0; g < quantized_ / group_; ++g)
      for (int64_t h = 0; h < heads_; ++h)
        for (int64_t d = 0; d < dim_; ++d) {
          const int64_t p = lay.param_index(g, h, d);
          dequantize_group(words_.data() + lay.word_index(g, h, d), group_, b, sym, scales_[p],
                           sym ? uint16_t{0} : mins_[p], &out.at(g * group_, h, d), row_);
        }
  } else {
    const TokenLayout lay = token_layout();
    for (int64_t t = 0; t < quantized_; ++t)
      for (int64_t h = 0; h < heads_; ++h)
        for (int64_t c = 0; c < lay.channel_groups(); ++c) {
          const int64_t p = lay.param_index(t, h, c);
          dequantize_group(words_.data() + lay.word_index(t, h, c), lay.group_len(c), b, sym,
                           scales_[p], sym ? uint16_t{0} : mins_[p], &out.at(t, h, c * group_), 1);
        }
  }
  if (resid_count_ > 0)
    std::memcpy(out.data.data() + quantized_ * row_, residual_row(0),
                sizeof(float) * resid_count_ * row_);
  return out;
}

Footprint SideCache::footprint() const {
  SchemeSpec s;
  s.params = spec_;
  return kvq::footprint(s, role_, Shape3{tokens_, heads_, dim_});
}

}  // namespace kvq::kivi
