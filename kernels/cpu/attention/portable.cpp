// Backend `cpu`: the portable attention path of one CPU path (kernels/cpu/attention/portable.h),
// one dequantized row at a time, compiled into every path.
#include "kernels/cpu/attention/portable.h"

#include <algorithm>
#include <vector>

#include "core/half.h"
#include "fp8/format.h"
#include "fp8/scale.h"
#include "kivi/group.h"
#include "kivi/layout.h"

namespace kvq::cpu::KVQ_CPU_PATH_NS::attn {

namespace {

// ---- portable path: one dequantized row at a time ----------------------------------------------

/// Row (t, h) as the reference reads it back (dequantized codes or exact values).
void fetch_row(const StoredSide& s, int64_t t, int64_t h, float* out) {
  const int64_t H = s.heads, D = s.dim, r = (t * H + h) * D;
  if (is_dense(s.kind) && t >= dense_end(s, t + 1)) {
    const float* x = s.residual + ((t - s.quantized_tokens) * H + h) * D;
    std::copy(x, x + D, out);
    return;
  }
  switch (s.kind) {
    case SchemeKind::Fp32:
      std::copy(s.f32 + r, s.f32 + r + D, out);
      return;
    case SchemeKind::Bf16:
      for (int64_t d = 0; d < D; ++d) out[d] = bf16_bits_to_float(s.half16[r + d]);
      return;
    case SchemeKind::Fp16:
      for (int64_t d = 0; d < D; ++d) out[d] = half_bits_to_float(s.half16[r + d]);
      return;
    case SchemeKind::Fp8:
      for (int64_t d = 0; d < D; ++d)
        out[d] = s.fp8_scales[fp8::scale_index(s.gran, t, h, d, H, D)] *
                 fp8::decode(s.format, s.codes[r + d]);
      return;
    case SchemeKind::Int:
      break;
  }
  if (t >= s.quantized_tokens) {
    const float* x = s.residual + ((t - s.quantized_tokens) * H + h) * D;
    std::copy(x, x + D, out);
    return;
  }
  for (int64_t d = 0; d < D; ++d) {
    int64_t p;
    uint32_t code;
    if (s.axis == Axis::Channel) {
      const kivi::ChannelLayout L{H, D, s.group, s.bits};
      p = L.param_index(t / s.group, h, d);
      code = L.code(s.words, t, h, d);
    } else {
      const kivi::TokenLayout L{H, D, s.group, s.bits};
      p = L.param_index(t, h, d / s.group);
      code = L.code(s.words, t, h, d);
    }
    const float sc = half_bits_to_float(s.scales[p]);
    const float mn = s.sym ? 0.0f : half_bits_to_float(s.mins[p]);
    out[d] = kivi::decode(code, sc, mn, s.bits, s.sym);
  }
}

/// Online-softmax step for one query head over n new scores (already scaled): turns them into
/// weights e^(s - m_new) in place, rescales o by e^(m - m_new) and updates m and l.
void softmax_step_scalar(float* s, int64_t n, float& m, float& l, float* o, int64_t D) {
  float mb = -INFINITY;
  for (int64_t t = 0; t < n; ++t) mb = std::max(mb, s[t]);
  const float mn = std::max(m, mb);
  if (all_minus_inf_step(s, n, mn, l, o, D)) return;
  const float alpha = m == -INFINITY ? 0.0f : std::exp(m - mn);
  float sum = 0;
  for (int64_t t = 0; t < n; ++t) sum += s[t] = std::exp(s[t] - mn);
  l = l * alpha + sum;
  if (alpha != 1.0f)
    for (int64_t d = 0; d < D; ++d) o[d] *= alpha;
  m = mn;
}

}  // namespace

void portable_range(const Call& c, int64_t a, int64_t b, Partial& P, Scratch& w) {
  const int64_t D = c.D;
  std::vector<float>& row = w.qs;
  w.qs_of = nullptr;  // qs now holds rows, not a scaled q
  std::vector<float>& s = w.s;
  if (row.size() < static_cast<size_t>(D)) row.resize(static_cast<size_t>(D));
  if (s.size() < static_cast<size_t>(c.nq * c.block)) s.resize(static_cast<size_t>(c.nq * c.block));
  for (int64_t t0 = a; t0 < b; t0 += c.block) {
    const int64_t t1 = std::min(b, t0 + c.block), n = t1 - t0;
    for (int64_t h = 0; h < c.H; ++h) {
      for (int64_t t = t0; t < t1; ++t) {
        fetch_row(c.k, t, h, row.data());
        for (int i = 0; i < c.nq; ++i) {
          const float* qi = c.q + (h * c.nq + i) * D;
          float acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += qi[d] * row[static_cast<size_t>(d)];
          s[static_cast<size_t>(i * c.block + (t - t0))] = acc * c.scale;
        }
      }
      for (int i = 0; i < c.nq; ++i) {
        const int64_t j = h * c.nq + i;
        softmax_step_scalar(s.data() + i * c.block, n, P.m[static_cast<size_t>(j)],
                            P.l[static_cast<size_t>(j)], P.o.data() + j * D, D);
      }
      for (int64_t t = t0; t < t1; ++t) {
        fetch_row(c.v, t, h, row.data());
        for (int i = 0; i < c.nq; ++i) {
          const float w = s[static_cast<size_t>(i * c.block + (t - t0))];
          float* o = P.o.data() + (h * c.nq + i) * D;
          for (int64_t d = 0; d < D; ++d) o[d] += w * row[static_cast<size_t>(d)];
        }
      }
    }
  }
}

}  // namespace kvq::cpu::KVQ_CPU_PATH_NS::attn
