// Backend `cpu`: the attention kernels of one CPU path (kernels/cpu/attention.h states what they
// compute), compiled once per path with its flags into kvq::cpu::<path> (kernels/cpu/isa.h): the
// portable row-at-a-time path, and where the build targets AVX2 the SIMD blocks. run_segment is
// the entry the causal scheduler (kernels/cpu/causal.cpp) calls through the path table.
//
// The kernels by concern (kernels/cpu/attention/): portable.{h,cpp}, the portable row-at-a-time
// path every path compiles; x86/, the SIMD blocks of the x86 paths (common.h, simd_math.h: e^x,
// sums, softmax; loaders.h: row loaders; float_dot.h: float dot products; kivi_exact.h,
// kivi_int8.h and kivi.cpp: KIVI sides; fp8_bf16dot.h, amx.h, row_scores.cpp and row_values.cpp:
// dense and fp8 sides; tile.cpp: a tile's block, blocks.h: the entries between them). This file is
// the entry.
#include "kernels/cpu/segment.h"

#include <algorithm>
#include <span>

#include "kernels/cpu/attention/portable.h"
#include "kernels/cpu/attention/x86/blocks.h"
#include "kernels/cpu/isa.h"

namespace kvq::cpu::KVQ_CPU_PATH_NS {

// kernels/cpu/segment.h states the contract.
void run_segment(std::span<const Member> ms, int64_t a, int64_t seg, Scratch& w) {
  const int64_t block = ms[0].c->block;
  // A new segment: a member's q may hold another query at the same address (kvq model reuses
  // it); within the segment it does not change, so its converted forms serve every block.
  w.qb_of = w.qs_of = nullptr;
  for (int64_t t0 = a; t0 < a + seg; t0 += block) {
    w.slots.clear();
    for (const Member& x : ms) {
      const int64_t b = std::min(x.end, a + seg), t1 = std::min(b, t0 + block);
      if (t0 >= b) continue;
      if (!x.fast) {
        if (std::max(t0, x.begin) < t1)
          attn::portable_range(*x.c, std::max(t0, x.begin), t1, *x.part, w);
        continue;
      }
      w.slots.push_back({x.c, x.part, x.s, t0, t1});
    }
    // The path's SIMD blocks, by instruction set family (one folder each; the portable path has
    // none, its members all take portable_range above).
#if KVQ_CPU_AVX2
    if (!w.slots.empty()) attn::simd_block(ms[0].c->nq, w.slots, w);
#endif
  }
}

}  // namespace kvq::cpu::KVQ_CPU_PATH_NS
