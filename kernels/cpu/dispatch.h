// Backend `cpu`: the one table through which every kernel call reaches the CPU path this process
// runs (kernels/cpu/isa.h, path()). Each path compiles the kernel sources with its own flags into
// its own namespace kvq::cpu::<path> (cmake/cpu_paths.cmake) and fills a Kernels table
// (kernels/cpu/path.cpp); kernels/cpu/dispatch.cpp picks one table at first use and defines the
// public functions of kernels/cpu/{fp8,kivi}.h and run_segment as forwarders through it. A kernel
// entry is one line of KVQ_CPU_KERNELS. Internal to the backend.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/spec.h"
#include "core/tensor.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kivi.h"
#include "kernels/cpu/segment.h"
#include "kivi/cache.h"

// X(member, function, return type, (parameters), (arguments)): each function a path defines in
// kvq::cpu::<path>, kvq::cpu forwards to, and the table's member that holds its address.
#define KVQ_CPU_KERNELS(X)                                                                         \
  X(fp8_row, fp8_quantize_row, void,                                                               \
    (Fp8Format f, const float* x, int64_t n, float s, uint8_t* codes), (f, x, n, s, codes))        \
  X(fp8_row_scales, fp8_quantize_row, void,                                                        \
    (Fp8Format f, const float* x, int64_t n, const float* s, uint8_t* codes), (f, x, n, s, codes)) \
  X(fp8_scales, fp8_compute_scales, std::vector<float>,                                            \
    (const Fp8Spec& spec, Role role, const Tensor3& x, int layer), (spec, role, x, layer))         \
  X(fp8_quant, fp8_quantize, void,                                                                 \
    (const Fp8Spec& spec, const std::vector<float>& scales, const Tensor3& x,                      \
     std::vector<uint8_t>& codes),                                                                 \
    (spec, scales, x, codes))                                                                      \
  X(fp8_dynamic, fp8_quantize_dynamic, void,                                                       \
    (const Fp8Spec& spec, Role role, const Tensor3& x, std::vector<float>& scales,                 \
     std::vector<uint8_t>& codes, int layer),                                                      \
    (spec, role, x, scales, codes, layer))                                                         \
  X(kivi_columns, kivi_quantize_columns, void,                                                     \
    (const float* x, int64_t cols, int n, int bits, bool sym, uint32_t* words, uint16_t* scales,   \
     uint16_t* mins),                                                                              \
    (x, cols, n, bits, sym, words, scales, mins))                                                  \
  X(kivi_row, kivi_quantize_row, void,                                                             \
    (const float* x, int64_t dim, int group, int bits, bool sym, uint32_t* words,                  \
     uint16_t* scales, uint16_t* mins),                                                            \
    (x, dim, group, bits, sym, words, scales, mins))                                               \
  X(kivi_quantizers, kivi_group_quantizers, kivi::GroupQuantizers, (), ())                         \
  X(kivi_tensor, kivi_quantize, void,                                                              \
    (const IntSpec& spec, Role role, const float* x, int64_t tokens, int64_t heads, int64_t dim,   \
     KiviPacked& out),                                                                             \
    (spec, role, x, tokens, heads, dim, out))                                                      \
  X(segment, run_segment, void, (std::span<const Member> ms, int64_t a, int64_t seg, Scratch & w), \
    (ms, a, seg, w))

namespace kvq::cpu {

/// \brief One path's table: what it compiles in, and its kernels.
struct Kernels {
  PathInfo info;
#define KVQ_CPU_MEMBER(member, function, ret, params, args) ret(*member) params;
  KVQ_CPU_KERNELS(KVQ_CPU_MEMBER)
#undef KVQ_CPU_MEMBER
};

/// \brief The table of the path this process runs (path() is its info).
const Kernels& kernels();

}  // namespace kvq::cpu
