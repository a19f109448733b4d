// Backend `cpu`: decode attention over the stored codes (one query token), the same operation as
// reference_cpu/attention.h's decode_attention: o = softmax(q K^T / sqrt(D)) V per query head,
// query head j reading kv head j / (q_heads / kv_heads).
//
// Causal attention for n positions (prefill, a chunk, or one decode step) on the same kernels.
//
// One pass over the context in token blocks with an online softmax (running max m, sum l and
// unnormalized output per query head; no T-long score row), token-major so each block of every
// head is read from contiguous memory, every code unpacked once for the whole GQA group. The
// context is cut into fixed segments (2 blocks, counted from token 0); each segment's partial is
// folded into the tokens before it, in order:
//   M = max(m_a, m_s),  l = e^(m_a - M) l_a + e^(m_s - M) l_s,  o likewise.
// Threads take whole segments (one position) or tiles of up to 16 positions (several; a tile goes
// through each block together, so its K/V comes from cache for all but the first), so the
// arithmetic of a position depends on neither the thread count nor the other positions of the
// call: chunked prefill and token-by-token decode give bit-identical outputs on this backend.
// Dense and fp8 sides read every kv head of a block (row (t, h) is row t*H + h); int sides go head
// by head. A decode step whose sides (or CausalInput::working_set) exceed a sixth of the L3
// streams them: dense rows in address order with a software prefetch ahead, int sides prefetching
// a block ahead; below that the L3 holds them between calls and they are read as cached (dense
// rows in token pairs, no prefetch; the same bits). fp8 rows always stream.
//
// Paths (AVX2+FMA+F16C; anything else takes the portable path, same results within tolerance;
// where the compiler also targets AVX-512 F/BW/VL, 512-bit forms as marked):
//   fp32 / bf16 / fp16   rows widened in registers, several tokens x query heads of accumulators
//                        (512-bit: 16 channels a step where head_dim is a multiple of 16)
//   fp8 (all formats, every granularity)   exact mode: codes decoded arithmetically (exact:
//                        fp8::decode; 512-bit: through binary16, kernels/cpu/simd_decode.h);
//                        where amx() holds, GQA <= 5 and head_dim is a multiple of 64 (and no
//                        e4m3fnuz NaN code is stored), AMX tiles with exact products instead:
//                        each code's value as a bf16 (a byte table, fp8_bf16x64), q * scale and
//                        the weights split into three bf16 parts that sum to them exactly,
//                        multiplied by tdpbf16ps (the parts as 3 GQA tile columns or rows), each
//                        score or output the sum of its three float chains;
//                        int8 mode: bf16 dot products (below)
//   int: keys per-channel (2/3/4/8 bits) or per-token (2/4/8 bits, G a multiple of 8: llama.cpp's
//     and HF QuantizedCache's layout), values per-token (2/4/8 bits, G a multiple of 8), the exact
//     residual window as fp32; head_dim a multiple of 8 and GQA 1-8 throughout (per-channel
//     values and 3-bit per-token sides take the portable path)
//     IntMode::Exact   codes widened to float; per-channel scales folded into q per group,
//                      per-token key rows dequantized in registers (scale * code + min)
//                      (512-bit: per-channel keys of 2/4/8 bits with tokens in the lanes, one
//                      fma per channel and 16 tokens; per-token values 16 channels a step)
//     IntMode::Int8    reduced-precision dot products on the codes where they apply (integer for
//                      int codes, bf16 for fp8), exact elsewhere:
//                      keys per-channel of 2 and 4 bits, G and head_dim multiples of 32: q * scale
//                      quantized to int8 per (key group, query head), scores as byte dots of four
//                      channels' q and codes; values per-token of 2 and 4 bits, G a multiple
//                      of 32 dividing head_dim: per run of 32 tokens counted from the block's
//                      start (blocks start at multiples of 256 tokens, or of whole key groups),
//                      channel group and query head, the weights p * scale quantized to 0..255
//                      against their maximum, outputs as byte dots of four tokens' weights and
//                      codes, the minima folded exactly (vpdpbusd with VNNI, else vpmaddubsw +
//                      vpmaddwd: the same integers; with AVX-512 VNNI and VBMI the keys take 16
//                      tokens and the values 16 channels of four tokens in the lanes of one
//                      vpdpbusd, brought there by byte permutes: the same integer sums and
//                      bytes of q and weights for the same inputs, the float sums around them
//                      in another order); fp8 sides of every format and granularity, head_dim a
//                      multiple of 32, where the compiler targets AVX-512 BF16 and VBMI
//                      (isa.h's kBf16Dot): bf16 dot products (vdpbf16ps), each code's bits
//                      shifted into a bf16 (its value times a power of two; subnormal codes
//                      read as 0, as vdpbf16ps reads bf16 subnormals), q * (per-channel scale)
//                      and the weights p * (token factor) rounded to bf16 (nearest-even), keys
//                      summing pairs of channels and values pairs of tokens (counted from each
//                      32-token run's start) in float; NaN codes (never written by the
//                      saturating encoder) read as finite numbers here. Where the compiler
//                      also targets AMX-TILE and AMX-BF16 and Linux grants the tiles
//                      (isa.h's amx(); KVQ_AMX=0 turns them off), the same bf16 operands go
//                      through tdpbf16ps (keys: 16 tokens by the NQ queries, values: NQ
//                      queries by 16 channels, 16 pairs a chain): the same definition, the
//                      float sums in another order
//
// Tolerances against the reference (tests/kernels/cpu/attention_test.cpp): Exact mode is float
// arithmetic in another order (and a polynomial exp), max |o - o_ref| <= 2e-5 * max |V| (outputs
// are convex combinations of V rows; observed <= 1.5e-6; the AMX tiles' exact products and the
// vector kernels both tested). Int8 mode equals its own definition
// (the rounded q * scale and weights, integer sums; for fp8 the bf16 roundings) within the same
// tolerance; its distance to the exact reference is the rounding of q * scale and of the weights
// (docs/benchmarks.md; for fp8 0.03-0.35% of max |V| on the test grid, and the model's mean KLD
// within 1.2% of the exact mode's, docs/results.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/stored_side.h"

namespace kvq::cpu {

/// \brief How codes are read: exact float products, or reduced-precision dot products (int8
/// query x kivi key codes, 8-bit weights x kivi value codes; bf16 query and weights x fp8 codes).
enum class IntMode { Exact, Int8 };

/// \brief The mode named "exact" or "int8" (the names configs, the CLI and Python take), or nullopt
/// for any other name; kIntModeNames lists them for error messages.
std::optional<IntMode> parse_int_mode(std::string_view name);
inline constexpr const char* kIntModeNames = "exact, int8";

/// \brief The L3 size, in bytes, the kernels assume when they choose how to read a call's sides:
/// where the sides' bytes exceed a sixth of it they stream from memory (prefetching ahead),
/// else they are read as cache-resident (kernels/cpu/causal.cpp, beyond_l3; the same bits
/// either way). 0 makes every call stream, -1 (the default) takes the size the system reports,
/// at most 192 MB (a VM's share of a larger shared L3; see beyond_l3). For tests and A/B runs
/// (`bench_attention --l3-bytes`); not while an attention call runs.
void set_l3_bytes(int64_t bytes);

struct DecodeOptions {
  int threads = 1;  ///< 0: all cores
  IntMode int_mode = IntMode::Exact;
  double working_set = 0;  ///< CausalInput::working_set
};

/// \brief o = softmax(q K^T / sqrt(d)) V over all tokens of k and v; q and out are
/// [q_heads, dim]. Throws kvq::Error on mismatched sides, an empty cache, or q_heads that is not a
/// multiple of the kv heads.
void decode_attention(const float* q, int64_t q_heads, const StoredSide& k, const StoredSide& v,
                      float* out, const DecodeOptions& opt = {});

/// \brief One causal attention call: positions t_begin .. t_begin + n - 1 over sides that hold
/// t_begin + n tokens. Position t attends to tokens 0..t exactly as a cache holding t + 1 tokens
/// stores them: the first k_quantized[t - t_begin] keys from the codes, the rest exact from
/// k_exact (values likewise), which must start at or below the first position's count (the
/// contract of reference_cpu's causal_attention; SideStore::quantized_tokens_at gives the counts).
/// Null tails (n = 1 only): the sides as stored, window included.
/// Sides with sink=S tokens (StoredSide::sink; both sides the same S): the sinks are one exact
/// partial per position, folded in front of the rest, which runs as a call over the tokens from S
/// on (positions before S read the sinks alone).
struct CausalInput {
  const float* q = nullptr;  ///< [n, q_heads, dim]
  int64_t n = 0, q_heads = 0, t_begin = 0;
  StoredSide k, v;
  ExactTail k_exact, v_exact;
  std::span<const int64_t> k_quantized, v_quantized;
  IntMode int_mode = IntMode::Exact;
  /// Bytes the caller reads between two calls over these sides (a model: every layer's cache);
  /// 0: the sides' own. With them the kernels decide whether the sides stream from memory
  /// (set_l3_bytes).
  double working_set = 0;
  /// > 0: a sliding window, position t attends to tokens t - window + 1 .. t only (transformers'
  /// sliding_window mask). A position whose window starts after token 0 runs on the portable path
  /// (scalar, block by block from the window's start); not with sinks (sink=S).
  int64_t window = 0;
};

struct Partial;

/// \brief A causal call cut into work items for a caller's own thread team: run every item (any
/// order, any thread, one Workspace per thread), then every merge. out is [n, q_heads, dim].
class CausalAttention {
 public:
  /// Per-thread scratch, reused across items and calls.
  struct Workspace {
    Workspace();
    ~Workspace();
    struct Impl;
    std::unique_ptr<Impl> impl;
  };
  /// Checks the input (throws kvq::Error naming what is wrong). `members`: threads that will
  /// run the items (fewer positions than members: one item per position and segment).
  CausalAttention(const CausalInput& in, int members);
  ~CausalAttention();
  int64_t items() const;
  void run(int64_t item, float* out, Workspace& w);
  int64_t merges() const;
  void merge(int64_t position, float* out) const;

 private:
  /// The sinks' partial of position p of the call as given (sink=S).
  Partial sink_partial(int64_t p) const;
  struct Parts;
  struct Position;
  Position position(int64_t p) const;
  int64_t segments(int64_t p) const;
  void segment(const Position& pos, int64_t p, int64_t s, Partial& out, Workspace& w) const;
  void finish(const Position& pos, int64_t p, const Partial& acc, float* out) const;
  CausalInput in_;
  int64_t segment_ = 0;
  int64_t tile_ = 1;  // positions per item when there is one item per several positions
  std::vector<int64_t> first_item_;
  std::unique_ptr<Parts> parts_;
  // sink=S: the call as given (q, first position, the sinks' K and V), the positions that read
  // only sinks (the first `sink_only_`), and the rest's quantized-token counts counted from S
  int64_t sinks_ = 0, sink_only_ = 0, q_heads_ = 0, dim_ = 0, t0_ = 0, kv_heads_ = 0;
  const float *q_ = nullptr, *k_sink_ = nullptr, *v_sink_ = nullptr;
  std::vector<int64_t> kq_, vq_;
};

/// \brief Runs a causal call on an OpenMP team of `threads` (0: all cores).
void causal_attention(const CausalInput& in, float* out, int threads = 1);

/// \brief Whether decode_attention takes a SIMD path for this pair of sides (else portable).
bool has_fast_path(const StoredSide& k, const StoredSide& v, int64_t q_heads);

}  // namespace kvq::cpu
