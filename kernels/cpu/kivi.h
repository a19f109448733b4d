// Backend `cpu`: KIVI integer quantize + pack, bit-identical to the reference (kivi/minmax.h for
// the formula, kivi/pack.h for the bits, kivi/layout.h for where they go; kivi::SideCache stores
// the same bytes). Min / max run on 8 or 16 lanes with the reference's compare-selects
// (vminps/vmaxps are x < m ? x : m exactly; for finite values the order does not matter), fp16
// parameters go through F16C vcvtps2ph (equal to float_to_half_bits on every non-NaN float:
// tests/kernels/cpu/kivi_test.cpp checks all 2^32 in the full tier; the NaN inputs never reach
// it, a group holding NaN/inf takes nan_params). Codes are the reference's clamped, nearest-even
// rounded IEEE quotient: estimated as (x - z) * (1 / s), which can only round differently next to
// a tie, so values whose estimate is within 2^-12 of a tie take the division (kivi.cpp states the
// bound). Any group in which a quotient lands exactly on a tie k + 1/2 is redone by
// kivi::quantize_group (the reference routine). With AVX-512, 16 columns or 16 groups at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "core/spec.h"
#include "kivi/cache.h"

namespace kvq::cpu {

/// \brief One token group of the per-channel side, all `cols` columns at once: element i of
/// column c is x[i * cols + c], i < n. Writes words[c * words_for(n, bits) + w], scales[c] and,
/// for asym, mins[c]: what kivi::quantize_group(x + c, cols, n, ...) writes for every column.
void kivi_quantize_columns(const float* x, int64_t cols, int n, int bits, bool sym, uint32_t* words,
                           uint16_t* scales, uint16_t* mins);

/// \brief One (token, head) row of the per-token side: ceil(dim / group) groups of `group`
/// contiguous channels (the last may be shorter), laid out as kivi::TokenLayout says for one
/// (token, head): words from `words`, parameters from scales[0] / mins[0].
void kivi_quantize_row(const float* x, int64_t dim, int group, int bits, bool sym, uint32_t* words,
                       uint16_t* scales, uint16_t* mins);

/// \brief The two above as a kivi::SideCache's group quantizers (its streaming appends then store
/// through backend cpu, byte for byte the same).
kivi::GroupQuantizers kivi_group_quantizers();

/// \brief Packed codes and fp16 parameters of a whole tensor in kivi/layout.h's layout.
struct KiviPacked {
  std::vector<uint32_t> words;
  std::vector<uint16_t> scales, mins;  ///< mins empty for sym
  int64_t quantized_tokens = 0;
};

/// \brief Quantizes x [tokens, heads, dim] on `role`'s axis of `spec` with no residual window:
/// the per-channel side quantizes the first floor(tokens / G) * G tokens, the per-token side all
/// of them - the bytes kivi::SideCache holds after one append of x with r=0. Throws kvq::Error on
/// an unsupported configuration (the same checks as kivi::SideCache).
void kivi_quantize(const IntSpec& spec, Role role, const float* x, int64_t tokens, int64_t heads,
                   int64_t dim, KiviPacked& out);

}  // namespace kvq::cpu
