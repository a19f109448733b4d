// The fp8 family's reference reads (reference_cpu/reads.h) over its stored view
// (schemes/fp8/storage.cpp): one code per element times its scale, the scale of element (t, h, d)
// factored as token_factor(t, h) * channel_factor(h, d) (fp8/scale.h's layouts).
#include "reference_cpu/reads.h"

#include <array>
#include <vector>

#include "fp8/format.h"

namespace kvq {
namespace {

using Lut = std::array<float, 256>;

Lut make_lut(Fp8Format f) {
  Lut l{};
  for (int c = 0; c < 256; ++c) l[static_cast<size_t>(c)] = fp8::decode(f, static_cast<uint8_t>(c));
  return l;
}

// Every code of a format as a float: a 256-entry table filled from fp8::decode (the one
// definition) once per format; a table load per element is cheaper here than the decode
// arithmetic.
const Lut& lut(Fp8Format f) {
  static const Lut e4m3 = make_lut(Fp8Format::E4M3), e4m3fnuz = make_lut(Fp8Format::E4M3FNUZ),
                   e5m2 = make_lut(Fp8Format::E5M2);
  switch (f) {
    case Fp8Format::E4M3:
      return e4m3;
    case Fp8Format::E4M3FNUZ:
      return e4m3fnuz;
    case Fp8Format::E5M2:
      return e5m2;
  }
  return e4m3;
}

// One row of codes as floats.
void widen(const Lut& l, const uint8_t* c, int64_t D, float* out) {
  for (int64_t d = 0; d < D; ++d) out[d] = l[c[d]];
}

float token_factor(const StoredSide& x, int64_t t, int64_t h) {
  switch (x.gran) {
    case Granularity::Tensor:
      return x.fp8_scales[0];
    case Granularity::Head:
      return x.fp8_scales[h];
    case Granularity::Token:
      return x.fp8_scales[t * x.heads + h];
    case Granularity::Channel:
      return 1.0f;
  }
  return 1.0f;
}

const float* channel_factors(const StoredSide& x, int64_t h) {
  return x.gran == Granularity::Channel ? x.fp8_scales + h * x.dim : nullptr;
}

void dot(const StoredSide& x, int64_t h, const float* q, int nq, int64_t t0, int64_t t1, float* s,
         int64_t ld) {
  const int64_t H = x.heads, D = x.dim;
  const Lut& l = lut(x.format);
  std::vector<float> qs(q, q + nq * D), row(static_cast<size_t>(D));
  if (const float* cf = channel_factors(x, h))  // fold per-channel scales into the query once
    for (int i = 0; i < nq; ++i)
      for (int64_t d = 0; d < D; ++d) qs[static_cast<size_t>(i * D + d)] *= cf[d];
  for (int64_t t = t0; t < t1; ++t) {
    widen(l, x.codes + (t * H + h) * D, D, row.data());
    const float f = token_factor(x, t, h);
    for (int i = 0; i < nq; ++i) {
      const float* qi = qs.data() + i * D;
      float acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t d = 0; d < D; ++d) acc += qi[d] * row[static_cast<size_t>(d)];
      s[i * ld + (t - t0)] = f * acc;
    }
  }
}

void accumulate(const StoredSide& x, int64_t h, const float* p, int nq, int64_t t0, int64_t t1,
                int64_t ld, float* out) {
  const int64_t H = x.heads, D = x.dim;
  const Lut& l = lut(x.format);
  std::vector<float> acc(static_cast<size_t>(nq * D), 0.0f), row(static_cast<size_t>(D));
  for (int64_t t = t0; t < t1; ++t) {
    widen(l, x.codes + (t * H + h) * D, D, row.data());
    const float f = token_factor(x, t, h);
    for (int i = 0; i < nq; ++i) {
      const float w = p[i * ld + (t - t0)] * f;
      float* a = acc.data() + i * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) a[d] += w * row[static_cast<size_t>(d)];
    }
  }
  const float* cf = channel_factors(x, h);  // per-channel scales multiply the sum once
  for (int i = 0; i < nq; ++i)
    for (int64_t d = 0; d < D; ++d)
      out[i * D + d] += acc[static_cast<size_t>(i * D + d)] * (cf ? cf[d] : 1.0f);
}

}  // namespace

extern const SchemeReads kFp8Reads;
const SchemeReads kFp8Reads{"fp8", dot, accumulate};

}  // namespace kvq
