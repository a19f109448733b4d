// core/footprint: bytes by hand from the layout rules (REFERENCE.md sections 3 and 5).
#include "core/footprint.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace kvq {
namespace {

// sink=S: S tokens at 16 bits (as the residual window) plus the scheme on the other T - S; rot=
// stores nothing. By hand: fp8 per token on [10, 2, 8] with 4 sinks: 6*2*8 = 96 code bytes,
// 6*2 scales * 4 B = 48, 4*2*8 elements * 2 B = 128 exact; 272 bytes in all.
TEST(Footprint, SinksCountAsExactTokensRotationIsFree) {
  const Footprint f = footprint(parse_spec("fp8:gran=token,sink=4,rot=hadamard"), Role::Key, {10, 2, 8});
  EXPECT_EQ(f.code_bytes, 96.0);
  EXPECT_EQ(f.scale_bytes, 48.0);
  EXPECT_EQ(f.residual_bytes, 128.0);
  EXPECT_EQ(f.total_bytes(), 272.0);
  EXPECT_EQ(f.quantized_elements, 96);
  EXPECT_EQ(f.residual_elements, 64);
  // Fewer tokens than sinks: everything exact.
  EXPECT_EQ(footprint(parse_spec("kivi2:sink=16"), Role::Value, {3, 2, 8}).total_bytes(), 96.0);
}

TEST(Footprint, PerLayerSpecNeedsOneLayer) {
  EXPECT_THROW((void)footprint(parse_spec("kivi2@0=kivi4"), Role::Key, {10, 2, 8}), Error);
  EXPECT_EQ(footprint(parse_spec("kivi2@0=bf16").for_layer(0), Role::Key, {10, 2, 8}).total_bytes(),
            320.0);
}

TEST(Footprint, DenseFormats) {
  const Shape3 s{10, 2, 64};  // 1280 elements
  EXPECT_EQ(footprint(parse_spec("fp32"), Role::Key, s).total_bytes(), 5120.0);
  EXPECT_EQ(footprint(parse_spec("bf16"), Role::Key, s).total_bytes(), 2560.0);
  EXPECT_EQ(footprint(parse_spec("fp16"), Role::Value, s).effective_bits(), 16.0);
}

TEST(Footprint, Fp8ScalesPerGranularity) {
  const Shape3 s{10, 2, 64};  // 1280 codes of 1 byte; fp32 scales
  // token: 10*2 scales * 4 B = 80 B -> 8 + 80*8/1280 = 8.5 bits
  EXPECT_DOUBLE_EQ(footprint(parse_spec("fp8_e4m3:gran=token"), Role::Key, s).effective_bits(), 8.5);
  // channel: 2*64 scales -> 512 B -> 8 + 3.2 = 11.2 bits
  EXPECT_DOUBLE_EQ(footprint(parse_spec("fp8_e4m3:gran=channel"), Role::Key, s).effective_bits(), 11.2);
  // head: 2 scales -> 8 B; tensor: 1 scale -> 4 B
  EXPECT_EQ(footprint(parse_spec("fp8_e5m2:gran=head"), Role::Key, s).scale_bytes, 8.0);
  EXPECT_EQ(footprint(parse_spec("fp8_e5m2:gran=tensor"), Role::Key, s).total_bytes(), 1284.0);
  // A constant scale is one number whatever the granularity.
  EXPECT_EQ(footprint(parse_spec("fp8_e4m3:gran=token,scale=1"), Role::Key, s).scale_bytes, 4.0);
}

// Issue 14: a split spec stores each side in its own scheme. By hand for [10, 2, 64]: keys bf16,
// 1280 x 2 B = 2560 B; values fp8 per token, 1280 B of codes + 20 fp32 scales = 80 B.
TEST(Footprint, SplitSpecEachSideItsOwn) {
  const Shape3 s{10, 2, 64};
  const SchemeSpec sp = parse_spec("k=bf16;v=fp8_e4m3:gran=token");
  EXPECT_EQ(footprint(sp, Role::Key, s).total_bytes(), 2560.0);
  EXPECT_EQ(footprint(sp, Role::Value, s).code_bytes, 1280.0);
  EXPECT_EQ(footprint(sp, Role::Value, s).scale_bytes, 80.0);
}

TEST(Footprint, Kivi2KeysAndValuesT300) {
  const SchemeSpec k = parse_spec("kivi2:g=32,r=128");
  const Shape3 s{300, 1, 64};
  // Keys (per-channel, B = R = 128): floor(300/128)*128 = 256 tokens quantized, 44 residual.
  // 64 channels x 256/32 = 512 groups; 32 codes of 2 bits = 2 words = 8 B per group.
  const Footprint fk = footprint(k, Role::Key, s);
  EXPECT_EQ(fk.quantized_elements, 256 * 64);
  EXPECT_EQ(fk.residual_elements, 44 * 64);
  EXPECT_EQ(fk.code_bytes, 512 * 8.0);
  EXPECT_EQ(fk.scale_bytes, 512 * 2.0);
  EXPECT_EQ(fk.zero_bytes, 512 * 2.0);
  EXPECT_EQ(fk.residual_bytes, 44 * 64 * 2.0);
  EXPECT_DOUBLE_EQ(fk.effective_bits(), 3.0);  // 2 + 32/32
  // Values (per-token window R = 128): 172 quantized tokens x 2 channel groups.
  const Footprint fv = footprint(k, Role::Value, s);
  EXPECT_EQ(fv.quantized_elements, 172 * 64);
  EXPECT_EQ(fv.residual_elements, 128 * 64);
  EXPECT_EQ(fv.code_bytes, 172 * 2 * 8.0);
  EXPECT_DOUBLE_EQ(fv.effective_bits(), 3.0);
}

TEST(Footprint, Int3PacksTenPerWordAndShortLastGroup) {
  // 3 bits: 10 codes per word, so a 32-code group needs 4 words (128 bits): 4 + 1 = 5 bits/elem.
  const SchemeSpec q = parse_spec("int3:k=token,v=token,g=32");
  EXPECT_DOUBLE_EQ(footprint(q, Role::Key, {7, 1, 64}).effective_bits(), 5.0);
  // head_dim 72 = 32 + 32 + 8: words 4 + 4 + 1 = 9 (36 B), 3 groups x 4 B of fp16 scale+min.
  const Footprint f = footprint(q, Role::Key, {1, 1, 72});
  EXPECT_EQ(f.code_bytes, 36.0);
  EXPECT_EQ(f.scale_bytes + f.zero_bytes, 12.0);
}

TEST(Footprint, SymmetricHasNoZeros) {
  const Footprint f = footprint(parse_spec("int4:k=token,v=token,g=32,sym"), Role::Key, {4, 2, 64});
  EXPECT_EQ(f.zero_bytes, 0.0);
  EXPECT_DOUBLE_EQ(f.effective_bits(), 4.5);  // 4 + 16/32
}

TEST(Footprint, QuantizedTokensRules) {
  IntSpec q;
  q.group = 32;
  q.residual = 0;
  EXPECT_EQ(quantized_tokens(q, Axis::Channel, 31), 0);
  EXPECT_EQ(quantized_tokens(q, Axis::Channel, 65), 64);
  EXPECT_EQ(quantized_tokens(q, Axis::Token, 65), 65);
  q.residual = 128;
  EXPECT_EQ(quantized_tokens(q, Axis::Channel, 255), 128);
  EXPECT_EQ(quantized_tokens(q, Axis::Token, 255), 127);
  EXPECT_EQ(quantized_tokens(q, Axis::Token, 100), 0);
}

}  // namespace
}  // namespace kvq
