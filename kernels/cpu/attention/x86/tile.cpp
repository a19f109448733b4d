// Backend `cpu`, x86 attention blocks: one block of a tile of positions (simd_block): each
// thread's scratch sized for the call, then sub-block by sub-block the scores by side kind
// (kivi.cpp, row_scores.cpp), each head's softmax step (simd_math.h) and the values (kivi.cpp,
// row_values.cpp).
#include "kernels/cpu/isa.h"

// The portable path compiles this file empty (its blocks are x86 SIMD: AVX2 and wider).
#if KVQ_CPU_AVX2

#include "kernels/cpu/attention/x86/amx.h"
#include "kernels/cpu/attention/x86/blocks.h"
#include "kernels/cpu/attention/x86/common.h"
#include "kernels/cpu/attention/x86/simd_math.h"

namespace kvq::cpu::KVQ_CPU_PATH_NS::attn {

namespace {

/// Sizes one thread's scratch for a call (grows only; contents need no initial values).
void prepare(Scratch& w, const Call& c) {
  const int64_t D = c.D;
  auto grow = [](auto& v, int64_t n) {
    if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  };
  grow(w.qs, c.q_heads * D);
  if (c.k.kind == SchemeKind::Int) {
    grow(w.wt, D * kivi::words_for(c.k.group, c.k.bits));
    grow(w.q8, c.nq * D);
  }
  if (fp8_bf16(c.mode, c.k)) {
    grow(w.qb, c.q_heads * D);
    grow(w.rowf, (kSubRows + 16) * c.H);
    if (amx()) {
      grow(w.qt, c.q_heads * D / 2);
      grow(w.ka, kSubRows * D);
    }
  }
  if (fp8_bf16(c.mode, c.v)) {
    grow(w.wp, c.q_heads * kSubRows / 2);
    grow(w.rowf, kSubRows * c.H + 16);
    if (amx()) grow(w.vb, 4 * 16 * 16);
  }
#if KVQ_CPU_AMX
  if (fp8_amx_exact(c.mode, c.k, c.nq, D)) {
    grow(w.qt, 3 * c.q_heads * D / 2);
    grow(w.ka, kSubRows * D);
    grow(w.rowf, (kSubRows + 16) * c.H);
  }
  if (fp8_amx_exact(c.mode, c.v, c.nq, D)) {
    grow(w.wp, 3 * c.q_heads * kSubRows / 2);
    grow(w.rowf, kSubRows * c.H + 16);
    grow(w.vb, 4 * 16 * 16);
  }
#endif
  if (c.v.kind == SchemeKind::Int) {
    const int64_t groups = D / c.v.group + 1;
    grow(w.pw, c.nq * kSubRows * groups);
    grow(w.msum, c.nq * groups);
    grow(w.sct, kSubRows * groups);
    grow(w.mnt, kSubRows * groups);
    grow(w.wb, c.nq * kSubRows * groups);
    grow(w.fac, c.nq * groups);
    grow(w.mv, 16 * c.nq * groups);
  }
}

bool row_kind(SchemeKind k) { return is_dense(k) || k == SchemeKind::Fp8; }

/// One block of every kv head for several positions at once (one for a decode step), each with
/// exactly the arithmetic it has alone (scores, each head's softmax step, values): scores and
/// values go sub-block by sub-block, every position of the tile through the same sub-block while
/// it is in L1. Dense and fp8 sides stream every head of a sub-block in address order (a token's
/// heads are contiguous); int sides go head by head. None of this changes a bit: a score is one
/// token's own dot product, a value row is one more fma on o (kept in memory between sub-blocks,
/// exactly), and each head's softmax step still comes between its scores and its values.
/// Per-token int values fold their minima once per call, so they take their block whole.
template <int NQ>
void simd_tile_block(std::span<const TileSlot> slots, Scratch& w) {
  const Call& c0 = *slots[0].c;
  const int64_t D = c0.D, H = c0.H, lds = c0.block + 8, hs = NQ * lds;
  const int64_t sub =
      c0.k.kind == SchemeKind::Int ? std::max<int64_t>(kSubRows, c0.k.group) : kSubRows;
  // One position streams its rows from memory once where they do not stay in the L3 (fp8 rows
  // always); several reuse them from cache.
  auto streams = [&](const StoredSide& x) {
    return slots.size() == 1 && (c0.ahead || x.kind == SchemeKind::Fp8);
  };
  const bool stream_k = streams(c0.k), stream_v = streams(c0.v);
  int64_t longest = 0;
  for (const TileSlot& x : slots) {
    prepare(w, *x.c);
    longest = std::max(longest, x.t1 - x.t0);
  }
  for (int64_t u = 0; u < longest; u += sub)
    for (const TileSlot& x : slots) {
      const int64_t a = x.t0 + u, b = std::min(x.t1, a + sub);
      if (a >= b) continue;
      if (row_kind(x.c->k.kind)) {
        if (stream_k)
          scores_rows<NQ, true>(*x.c, a, b, x.s + u, hs, lds, w);
        else
          scores_rows<NQ, false>(*x.c, a, b, x.s + u, hs, lds, w);
      } else {
        for (int64_t h = 0; h < H; ++h) scores<NQ>(*x.c, h, a, b, x.s + h * hs + u, lds, w);
      }
    }
  for (const TileSlot& x : slots)
    for (int64_t h = 0; h < H; ++h)
      softmax_rows<NQ>(x.s + h * hs, lds, x.t1 - x.t0, x.c->scale, x.P->m.data() + h * NQ,
                       x.P->l.data() + h * NQ, x.P->o.data() + h * NQ * D, D);
  const bool whole = c0.v.kind == SchemeKind::Int;
  for (int64_t u = 0; u < longest; u += whole ? longest : kSubRows)
    for (const TileSlot& x : slots) {
      const int64_t a = x.t0 + u, b = whole ? x.t1 : std::min(x.t1, a + kSubRows);
      if (a >= b) continue;
      if (row_kind(x.c->v.kind)) {
        if (stream_v)
          values_rows<NQ, true>(*x.c, a, b, x.s + u, hs, lds, x.P->o.data(), w);
        else
          values_rows<NQ, false>(*x.c, a, b, x.s + u, hs, lds, x.P->o.data(), w);
      } else {
        for (int64_t h = 0; h < H; ++h)
          values<NQ>(*x.c, h, a, b, x.s + h * hs + u, lds, x.P->o.data() + h * NQ * D, w);
      }
    }
}

/// Calls f.template operator()<NQ>() for the call's GQA group.
template <class F>
void dispatch_nq(int nq, F&& f) {
  switch (nq) {
    case 1:
      return f.template operator()<1>();
    case 2:
      return f.template operator()<2>();
    case 3:
      return f.template operator()<3>();
    case 4:
      return f.template operator()<4>();
    case 5:
      return f.template operator()<5>();
    case 6:
      return f.template operator()<6>();
    case 7:
      return f.template operator()<7>();
    case 8:
      return f.template operator()<8>();
  }
  fail("cpu attention: GQA group {} outside 1..8", nq);
}

}  // namespace

void simd_block(int nq, std::span<const TileSlot> slots, Scratch& w) {
  dispatch_nq(nq, [&]<int NQ>() { simd_tile_block<NQ>(slots, w); });
}

}  // namespace kvq::cpu::KVQ_CPU_PATH_NS::attn

#endif  // KVQ_CPU_AVX2
