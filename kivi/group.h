// One group, end to end: min-max statistics, fp16 parameters, codes and their packed words
// (kivi/minmax.h for the formula, kivi/pack.h for the bits). The CPU cache and the CUDA kernels
// quantize a group through this routine or, batched, through the same minmax.h functions.
#pragma once

#include "core/error.h"
#include "core/hostdev.h"
#include "kivi/minmax.h"
#include "kivi/pack.h"

namespace kvq::kivi {

/// \brief Quantizes the n >= 1 values x[0], x[stride], ..., x[(n-1)*stride] as one group:
/// writes words_for(n, bits) packed words, the fp16 scale and, for asym only, the fp16 min
/// (sym writes nothing there; min_h may be null then).
KVQ_HD void quantize_group(const float* x, int64_t stride, int n, int bits, bool sym,
                           uint32_t* words, uint16_t* scale_h, uint16_t* min_h) {
  GroupRange r = GroupRange::of(x[0]);
  for (int i = 1; i < n; ++i) r.add(x[i * stride]);
  const GroupParams p = minmax_params(r, bits, sym);
  *scale_h = p.scale_h;
  if (!sym) *min_h = p.min_h;
  const int cpw = codes_per_word(bits);
  for (int w = 0; w * cpw < n; ++w) {
    uint32_t word = 0;
    for (int i = w * cpw; i < n && i < (w + 1) * cpw; ++i)
      word |= encode(x[i * stride], p, bits, sym) << shift_of(i, bits);
    words[w] = word;
  }
}

/// \brief quantize_group under KIVI's own arithmetic (arith=fp16: minmax_params_fp16,
/// encode_fp16), asymmetric: the same words, scale and min layout.
KVQ_HD void quantize_group_fp16(const float* x, int64_t stride, int n, int bits, uint32_t* words,
                                uint16_t* scale_h, uint16_t* min_h) {
  GroupRange r = GroupRange::of(x[0]);
  for (int i = 1; i < n; ++i) r.add(x[i * stride]);
  const GroupParams p = minmax_params_fp16(r, bits);
  *scale_h = p.scale_h;
  *min_h = p.min_h;
  const int cpw = codes_per_word(bits);
  for (int w = 0; w * cpw < n; ++w) {
    uint32_t word = 0;
    for (int i = w * cpw; i < n && i < (w + 1) * cpw; ++i)
      word |= encode_fp16(x[i * stride], p, bits) << shift_of(i, bits);
    words[w] = word;
  }
}

/// \brief Reads a group back: out[i * stride] = the value of code i, for i < n.
KVQ_HD void dequantize_group(const uint32_t* words, int n, int bits, bool sym, uint16_t scale_h,
                             uint16_t min_h, float* out, int64_t stride) {
  const float scale = half_bits_to_float(scale_h);
  const float min = sym ? 0.0f : half_bits_to_float(min_h);
  for (int i = 0; i < n; ++i)
    out[i * stride] = decode(unpack_one(words, i, bits), scale, min, bits, sym);
}

#if !defined(__CUDACC__)
/// \brief Runs f.template operator()<B, S>() for the runtime bits and sym: the one list of
/// supported bit widths turned into template parameters (host code; others throw).
template <typename F>
void dispatch_bits(int bits, bool sym, F&& f) {
  switch (bits) {
    case 2:
      return sym ? f.template operator()<2, true>() : f.template operator()<2, false>();
    case 3:
      return sym ? f.template operator()<3, true>() : f.template operator()<3, false>();
    case 4:
      return sym ? f.template operator()<4, true>() : f.template operator()<4, false>();
    case 8:
      return sym ? f.template operator()<8, true>() : f.template operator()<8, false>();
    default:
      fail("kivi: {} bits not supported (allowed: 2, 3, 4, 8)", bits);
  }
}

/// \brief Runs f.template operator()<B>() for the runtime bits (the same list; for code that
/// does not specialize on sym).
template <typename F>
void dispatch_bits(int bits, F&& f) {
  dispatch_bits(bits, false, [&]<int B, bool>() { return f.template operator()<B>(); });
}
#endif

}  // namespace kvq::kivi
