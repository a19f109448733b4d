// The float family's reference reads (reference_cpu/reads.h) over its stored view
// (schemes/float/storage.cpp): fp32 values as they are, bf16 / fp16 bits widened in registers.
#include "reference_cpu/reads.h"

#include <vector>

#include "core/half.h"
#include "reference_cpu/dense_ops.h"

namespace kvq {
namespace {

template <bool kBf16>
float widen(uint16_t b) {
  return kBf16 ? bf16_bits_to_float(b) : half_bits_to_float(b);
}

// One token's row widened to float: a buffer per thread (sides are read by several threads at
// once, one head each), grown once instead of allocated on every call.
float* widened_row(int64_t D) {
  thread_local std::vector<float> row;
  if (row.size() < static_cast<size_t>(D)) row.resize(static_cast<size_t>(D));
  return row.data();
}

template <bool kBf16>
void widen_row(const uint16_t* r, int64_t D, float* row) {
  for (int64_t d = 0; d < D; ++d) row[d] = widen<kBf16>(r[d]);
}

template <bool kBf16>
void half_dot(const StoredSide& x, int64_t h, const float* q, int nq, int64_t t0, int64_t t1,
              float* s, int64_t ld) {
  const int64_t H = x.heads, D = x.dim;
  float* row = widened_row(D);
  for (int64_t t = t0; t < t1; ++t) {
    widen_row<kBf16>(x.half16 + (t * H + h) * D, D, row);
    for (int i = 0; i < nq; ++i) {
      const float* qi = q + i * D;
      float acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t d = 0; d < D; ++d) acc += qi[d] * row[d];
      s[i * ld + (t - t0)] = acc;
    }
  }
}

template <bool kBf16>
void half_accumulate(const StoredSide& x, int64_t h, const float* p, int nq, int64_t t0, int64_t t1,
                     int64_t ld, float* out) {
  const int64_t H = x.heads, D = x.dim;
  float* row = widened_row(D);
  for (int64_t t = t0; t < t1; ++t) {
    widen_row<kBf16>(x.half16 + (t * H + h) * D, D, row);
    for (int i = 0; i < nq; ++i) {
      const float w = p[i * ld + (t - t0)];
      float* o = out + i * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) o[d] += w * row[d];
    }
  }
}

// Runs half.template operator()<kBf16>() for a bf16 / fp16 view, dense() for an fp32 one.
template <class Half, class Dense>
void by_kind(SchemeKind kind, Half&& half, Dense&& dense) {
  switch (kind) {
    case SchemeKind::Bf16:
      return half.template operator()<true>();
    case SchemeKind::Fp16:
      return half.template operator()<false>();
    default:
      return dense();
  }
}

void dot(const StoredSide& x, int64_t h, const float* q, int nq, int64_t t0, int64_t t1, float* s,
         int64_t ld) {
  by_kind(
      x.kind, [&]<bool kBf16>() { half_dot<kBf16>(x, h, q, nq, t0, t1, s, ld); },
      [&] { dense_dot(x.f32, x.heads, x.dim, h, q, nq, t0, t1, s, ld); });
}

void accumulate(const StoredSide& x, int64_t h, const float* p, int nq, int64_t t0, int64_t t1,
                int64_t ld, float* out) {
  by_kind(
      x.kind, [&]<bool kBf16>() { half_accumulate<kBf16>(x, h, p, nq, t0, t1, ld, out); },
      [&] { dense_accumulate(x.f32, x.heads, x.dim, h, p, nq, t0, t1, ld, out); });
}

}  // namespace

extern const SchemeReads kFloatReads;
const SchemeReads kFloatReads{"float", dot, accumulate};

}  // namespace kvq
