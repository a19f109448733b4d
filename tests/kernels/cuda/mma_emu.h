// The host tests' emulation of mma.m16n8k16 (tests/kernels/cuda/mma_*_test.cpp): fragments as
// kernels/cuda/mma_layout.h's PTX tables say, one register per lane; products exact, each mma's
// sum over k in double, accumulated into float (the C registers).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/mma_layout.h"

namespace kvq::cuda::mma_emu {

using Frag = std::vector<uint32_t>;  // one register per lane
using Frag4 = std::array<Frag, 4>;

/// The element type of both operands: bf16 (the bf16 kernel) or fp16 (the FP8 and int kernels).
enum class Elem { Bf16, F16 };

template <Elem E>
float elem(uint16_t bits) {
  if constexpr (E == Elem::Bf16) return bf16_bits_to_float(bits);
  return half_bits_to_float(bits);
}
template <Elem E>
float lo_of(uint32_t w) {
  return elem<E>(static_cast<uint16_t>(w));
}
template <Elem E>
float hi_of(uint32_t w) {
  return elem<E>(static_cast<uint16_t>(w >> 16));
}

/// C += A B.
template <Elem E>
void mma(float (&c)[32][4], const Frag4& a, const Frag& b0, const Frag& b1) {
  float A[16][16] = {}, B[16][8] = {};
  for (int l = 0; l < 32; ++l) {
    for (int r = 0; r < 4; ++r) {
      A[mma::a_row(l, r)][mma::a_col(l, r, 0)] = lo_of<E>(a[r][l]);
      A[mma::a_row(l, r)][mma::a_col(l, r, 1)] = hi_of<E>(a[r][l]);
    }
    for (int r = 0; r < 2; ++r) {
      const uint32_t w = r == 0 ? b0[l] : b1[l];
      B[mma::b_row(l, r, 0)][mma::b_col(l)] = lo_of<E>(w);
      B[mma::b_row(l, r, 1)][mma::b_col(l)] = hi_of<E>(w);
    }
  }
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      double s = 0;
      for (int k = 0; k < 16; ++k)
        s += static_cast<double>(A[mma::c_row(l, i)][k]) * B[k][mma::c_col(l, i)];
      c[l][i] += static_cast<float>(s);
    }
}

}  // namespace kvq::cuda::mma_emu
