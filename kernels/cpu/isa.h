// Backend `cpu`: which instruction set the kernels were compiled for. The AVX2+FMA+F16C path is
// chosen at compile time (-march=native on this machine, or -mavx2 -mfma -mf16c); without those
// flags, or with KVQ_CPU_PORTABLE defined, every kernel takes its portable scalar path (the same
// results: the quantizers are bit-identical either way, attention stays within the tolerances
// stated in kernels/cpu/attention.h).
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(KVQ_CPU_PORTABLE)
#define KVQ_CPU_AVX2 1
#include <immintrin.h>
#else
#define KVQ_CPU_AVX2 0
#endif

namespace kvq::cpu {

/// \brief True when the AVX2+FMA+F16C kernels are compiled in.
inline constexpr bool kAvx2 = KVQ_CPU_AVX2 != 0;

/// \brief The instruction set of the compiled kernels, for result rows and bench output.
inline const char* isa() { return kAvx2 ? "avx2+fma+f16c" : "portable"; }

}  // namespace kvq::cpu
