// cache/schemes: the storage sweep over core/schemes.h's registry. For every example spec
// of every family, both roles, on a ragged shape (kShape): the footprint formula equals the bytes
// the stored view actually holds (counted from the layouts, fp8/scale.h and kivi/layout.h, through
// tests/support/stored_counts.h) and the family's coded_tokens the side's own count; the streamed
// side reads back what the whole-tensor round trip gives; and the round trip's error stays within
// the family's bound (SchemeTraits::max_error, derived from each format's rounding in
// schemes/<family>/traits.cpp).
#include "cache/schemes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>

#include "cache/round_trip.h"
#include "cache/side.h"
#include "core/schemes.h"
#include "tests/support/stored_counts.h"

namespace kvq {
namespace {

// Ragged on every axis: 160 tokens are a multiple of no group or window (kivi's r=128 keys
// quantize 128 tokens, its values 32), head_dim 72 of no group (per-token sides end in a short
// channel group of 8).
constexpr Shape3 kShape{160, 2, 72};

// N(0, 1) with a few outlier channels (x6, as real keys have). Token 0 holds each (head, channel)'s
// largest magnitude, so dynamic fp8 scales taken from the first tokens (first=N) cover every later
// token: the premise of the fp8 bound (no saturation).
Tensor3 input(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Tensor3 x(kShape);
  const int64_t row = kShape.heads * kShape.dim;
  for (int64_t i = 0; i < x.shape.numel(); ++i)
    x.data[i] = nd(rng) * ((i % kShape.dim) % 13 == 0 ? 6.0f : 1.0f);
  for (int64_t c = 0; c < row; ++c) {
    float m = 0;
    for (int64_t t = 1; t < kShape.tokens; ++t) m = std::max(m, std::fabs(x.data[t * row + c]));
    x.data[c] = (c % 2 ? -1.0f : 1.0f) * m;
  }
  return x;
}

// The bytes a view holds, counted from its arrays' layouts (16-bit exact tokens, as footprint
// counts the window and the sinks).
double stored_bytes(const StoredSide& s) {
  const int64_t own = s.tokens - s.sink_tokens, row = s.heads * s.dim;
  double b = 2.0 * static_cast<double>(s.sink_tokens * row);
  switch (s.kind) {
    case SchemeKind::Fp32:
      return b + 4.0 * static_cast<double>(own * row);
    case SchemeKind::Bf16:
    case SchemeKind::Fp16:
      return b + 2.0 * static_cast<double>(own * row);
    case SchemeKind::Fp8: {
      const testing::StoredCounts c = testing::stored_counts(s, own);
      return b + static_cast<double>(c.codes) + 4.0 * static_cast<double>(c.scales);
    }
    case SchemeKind::Int: {
      const testing::StoredCounts c = testing::stored_counts(s, s.quantized_tokens);
      return b + 4.0 * static_cast<double>(c.words) +
             (s.sym ? 2.0 : 4.0) * static_cast<double>(c.params) +
             2.0 * static_cast<double>((own - s.quantized_tokens) * row);
    }
  }
  return -1;
}

TEST(SchemeStorage, EveryFamilyHasReferenceStorage) {
  for (const SchemeKind k : scheme_kinds())
    EXPECT_EQ(scheme_storage(k).family, scheme_traits(k).family);
}

TEST(SchemeStorage, FootprintIsTheStoredBytes) {
  const Tensor3 x = input(7);
  for (const SchemeTraits* t : scheme_families())
    for (const std::string_view e : t->examples)
      for (const Role role : {Role::Key, Role::Value}) {
        SCOPED_TRACE(std::string(e) + (role == Role::Key ? " key" : " value"));
        const SchemeSpec s = parse_spec(e);
        const auto side = make_side(s, role, x);
        const Footprint f = footprint(s, role, kShape);
        EXPECT_EQ(side->footprint().total_bytes(), f.total_bytes());
        EXPECT_EQ(f.quantized_elements + f.residual_elements, kShape.numel());
        EXPECT_EQ(stored_bytes(side->stored()), f.total_bytes());
        // The tokens held as codes, by the family's rule, against the side's own count (fp32 is the
        // exact cache: no codes, though its side reads every token as stored).
        if (s.sink == 0) {
          EXPECT_EQ(t->coded_tokens(s, role, kShape.tokens, false),
                    s.kind() == SchemeKind::Fp32 ? 0 : side->quantized_tokens_at(kShape.tokens));
        }
      }
}

// What `kvq quant --codes` writes (each family's stored_bytes): every tensor holds its shape's
// elements at its dtype's size, the coded tensors hold the footprint formula's code, scale and
// zero bytes (core/footprint), and the tokens they cover plus the exact tail are the whole side.
TEST(SchemeStorage, StoredBytesAreTheFootprintsCodes) {
  const Tensor3 x = input(5);
  const std::map<std::string, int64_t> size{
      {"F32", 4}, {"BF16", 2}, {"F16", 2}, {"U8", 1}, {"U32", 4}};
  for (const SchemeTraits* t : scheme_families())
    for (const std::string_view e : t->examples)
      for (const Role role : {Role::Key, Role::Value}) {
        SCOPED_TRACE(std::string(e) + (role == Role::Key ? " key" : " value"));
        const SchemeSpec s = parse_spec(e);
        if (s.rot.on || s.sink > 0) continue;  // --codes refuses them (one scheme's bytes)
        const auto side = make_side(s, role, x);
        const StoredSide view = side->stored();
        const int64_t qt = side->quantized_tokens_at(kShape.tokens);
        StoredBytes out;
        const int64_t covered = scheme_storage(view.kind).stored_bytes(view, qt, out);
        EXPECT_EQ(covered, s.kind() == SchemeKind::Fp32 ? kShape.tokens : qt);
        double bytes = 0;
        for (const RawTensor& r : out.tensors) {
          int64_t n = 1;
          for (const int64_t d : r.shape) n *= d;
          ASSERT_TRUE(size.count(r.dtype)) << r.name << " " << r.dtype;
          EXPECT_EQ(static_cast<int64_t>(r.bytes.size()), n * size.at(r.dtype)) << r.name;
          bytes += static_cast<double>(r.bytes.size());
        }
        const Footprint f = footprint(s, role, kShape);
        EXPECT_EQ(bytes, f.code_bytes + f.scale_bytes + f.zero_bytes);
        EXPECT_EQ((kShape.tokens - covered) * kShape.heads * kShape.dim,
                  s.kind() == SchemeKind::Fp32 ? 0 : f.residual_elements);
      }
}

TEST(SchemeStorage, RoundTripWithinTheFamilysBound) {
  const Tensor3 x = input(11);
  double amax = 0;
  for (const float v : x.data) amax = std::max(amax, std::fabs(static_cast<double>(v)));
  for (const SchemeTraits* t : scheme_families())
    for (const std::string_view e : t->examples)
      for (const Role role : {Role::Key, Role::Value}) {
        SCOPED_TRACE(std::string(e) + (role == Role::Key ? " key" : " value"));
        const SchemeSpec s = parse_spec(e);
        const RoundTrip r = round_trip(s, role, x);
        // rot= rounds in the rotated basis: R is orthonormal, so the error's norm per row is the
        // same, but one element may gather a row's errors (sqrt(dim) times the bound; the
        // rotated amax is at most sqrt(dim) amax as well).
        const double bound = t->max_error(s, amax) * (s.rot.on ? kShape.dim : 1.0);
        double worst = 0;
        for (size_t i = 0; i < x.data.size(); ++i)
          worst = std::max(worst, std::fabs(static_cast<double>(r.values.data[i]) - x.data[i]));
        EXPECT_LE(worst, bound) << "amax " << amax;
        if (s.kind() != SchemeKind::Fp32) {
          EXPECT_GT(worst, 0.0) << "nothing was quantized";
        }
        // The streamed side reads back the same values (the one definition, two paths).
        const Tensor3 streamed = make_side(s, role, x)->dequantize();
        EXPECT_EQ(streamed.data, r.values.data);
      }
}

}  // namespace
}  // namespace kvq
