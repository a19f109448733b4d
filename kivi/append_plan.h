// The KIVI append policy, written once: which tokens of an append leave the residual window (and
// are quantized) and which stay exact. kivi::SideCache (kivi/cache.cpp) and the device cache
// kvq::cuda::KiviSideCache (kernels/cuda/kivi_cache_device.cu, on its host side) both carry out
// this plan; pure arithmetic on counts (KVQ_HD), so device code may call it too.
//
// The rules (REFERENCE.md section 3), for a side with group G and residual window R, holding T
// tokens in total:
// - per-channel side (KIVI keys: statistics per (head, channel) over G consecutive tokens, so a
//   token group can only be quantized once it is complete): let B = R if R > 0 else G (R must be
//   a multiple of G). The first floor(T / B) * B tokens are quantized, the last T mod B stay full
//   precision: a buffer that flushes every B tokens, a whole block at once.
// - per-token side (KIVI values: statistics per (token, head) over G consecutive channels, each
//   token quantized alone): the first max(T - R, 0) tokens are quantized, the last min(T, R)
//   stay: a sliding window of exactly R tokens.
// Both depend on T only, so a prefill, chunks or one token at a time give the same cache; tokens
// are quantized oldest first and never twice. (KIVI's own code also requires R > 0 and
// R % G == 0 and, within one decode step, attends before it flushes; kvq's caches flush in the
// append, then attend.)
//
// One append of n tokens x[0, n) to a side holding T tokens, Q = quantized_count(T) of them
// quantized and the window holding tokens [Q, T) (oldest first), runs in this order:
//   1. x rows [0, topup) join the end of the window (per-channel only: they complete the block
//      the window has started, so that the block is contiguous to quantize);
//   2. window rows [0, from_window) are quantized, oldest first, and leave the window;
//   3. x rows [topup, topup + from_x) are quantized straight from x;
//   4. x rows [topup + from_x, n) join the end of the window (they stay exact).
// Per-channel, from_window and from_x are multiples of G (whole token groups, starting at a
// multiple of G); the window never holds more than B tokens (per-token: R).
#pragma once

#include <cstdint>

#include "core/hostdev.h"
#include "core/spec.h"

namespace kvq::kivi {

/// \brief What one append does to a side's window (steps 1-4 above) and the side's state after.
struct AppendPlan {
  int64_t topup = 0;        ///< x rows [0, topup) join the window first (per-channel only)
  int64_t from_window = 0;  ///< window rows [0, from_window) then quantized, oldest first
  int64_t from_x = 0;       ///< x rows [topup, topup + from_x) then quantized
  int64_t tokens = 0;       ///< T + n, tokens held after
  int64_t quantized = 0;    ///< quantized_count(T + n), tokens held quantized after
  /// \brief x rows [kept_from(), n) join the window last (they stay exact).
  KVQ_HD int64_t kept_from() const { return topup + from_x; }
};

/// \brief The residual rule of one side: its axis, its group G (resolved: g=dim is head_dim) and
/// its window R.
struct AppendRule {
  Axis axis = Axis::Channel;
  int64_t group = 1;
  int64_t residual = 0;

  /// \brief Per-channel: B, the tokens that flush together (R if R > 0 else G).
  KVQ_HD int64_t block() const { return residual > 0 ? residual : group; }
  /// \brief Tokens of T held quantized: per-channel floor(T / B) * B, per-token max(T - R, 0).
  KVQ_HD int64_t quantized_count(int64_t tokens) const {
    if (axis == Axis::Channel) return tokens / block() * block();
    return tokens > residual ? tokens - residual : 0;
  }

  /// \brief The plan of appending n >= 0 tokens to a side holding `tokens` (its state by the
  /// rule: quantized_count(tokens) quantized, the rest in the window).
  KVQ_HD AppendPlan plan(int64_t tokens, int64_t n) const {
    AppendPlan p;
    const int64_t quantized = quantized_count(tokens), window = tokens - quantized;
    p.tokens = tokens + n;
    p.quantized = quantized_count(p.tokens);
    const int64_t leaving = p.quantized - quantized;  // tokens quantized by this append
    if (axis == Axis::Channel) {
      // A flush quantizes whole blocks: the one the window has started (topped up from x) first,
      // then complete blocks straight from x.
      if (leaving > 0 && window > 0) {
        p.topup = block() - window;
        p.from_window = block();
      }
      p.from_x = leaving - p.from_window;
    } else {
      // The oldest leave first: window rows, then (if the whole window leaves) x rows.
      p.from_window = leaving < window ? leaving : window;
      p.from_x = leaving - p.from_window;
    }
    return p;
  }
};

}  // namespace kvq::kivi
