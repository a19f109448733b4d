// core/spec: the scheme-spec grammar (core/spec.h header comment and the issues' spec lists).
#include "core/spec.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace kvq {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_spec(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Spec, PlainFormats) {
  EXPECT_EQ(parse_spec("fp32").kind, SchemeKind::Fp32);
  EXPECT_EQ(parse_spec("bf16").kind, SchemeKind::Bf16);
  EXPECT_EQ(parse_spec("fp16").kind, SchemeKind::Fp16);
}

TEST(Spec, Fp8DefaultsAreTensorDynamic) {
  const auto s = parse_spec("fp8_e4m3");
  EXPECT_EQ(s.kind, SchemeKind::Fp8);
  EXPECT_EQ(s.fp8.format, Fp8Format::E4M3);
  EXPECT_EQ(s.fp8.gran, Granularity::Tensor);
  EXPECT_EQ(s.fp8.source, ScaleSource::Dynamic);
  EXPECT_EQ(s.canonical(), "fp8_e4m3:gran=tensor,scale=dynamic");
}

TEST(Spec, Fp8EveryGranularityAndSource) {
  EXPECT_EQ(parse_spec("fp8_e5m2:gran=channel").fp8.gran, Granularity::Channel);
  EXPECT_EQ(parse_spec("fp8_e4m3fnuz:gran=token").fp8.format, Fp8Format::E4M3FNUZ);
  const auto c = parse_spec("fp8_e4m3:gran=head,scale=0.25");
  EXPECT_EQ(c.fp8.source, ScaleSource::Constant);
  EXPECT_EQ(c.fp8.constant, 0.25f);
  EXPECT_EQ(c.canonical(), "fp8_e4m3:gran=head,scale=0.25");
  const auto k = parse_spec("fp8_e4m3:scale=calib:/tmp/s.json,gran=head");
  EXPECT_EQ(k.fp8.source, ScaleSource::Calib);
  EXPECT_EQ(k.fp8.calib_path, "/tmp/s.json");
}

TEST(Spec, KiviDefaultsG32R128) {
  const auto s = parse_spec("kivi2");
  EXPECT_EQ(s.kind, SchemeKind::Int);
  EXPECT_EQ(s.q.bits, 2);
  EXPECT_EQ(s.q.group, 32);
  EXPECT_EQ(s.q.residual, 128);
  EXPECT_EQ(s.q.key_axis, Axis::Channel);
  EXPECT_EQ(s.q.value_axis, Axis::Token);
  EXPECT_EQ(s.canonical(), "kivi2:g=32,r=128");
  EXPECT_EQ(parse_spec("kivi4:g=64,r=64").canonical(), "kivi4:g=64,r=64");
}

TEST(Spec, IntNeedsAxesAndDefaultsR0) {
  const auto s = parse_spec("int3:k=token,v=channel,g=16,sym");
  EXPECT_EQ(s.q.bits, 3);
  EXPECT_EQ(s.q.key_axis, Axis::Token);
  EXPECT_EQ(s.q.value_axis, Axis::Channel);
  EXPECT_EQ(s.q.group, 16);
  EXPECT_EQ(s.q.residual, 0);
  EXPECT_TRUE(s.q.sym);
  EXPECT_EQ(s.canonical(), "int3:k=token,v=channel,g=16,r=0,sym");
  EXPECT_EQ(parse_spec("int8:k=token,v=token,g=dim").q.group, kGroupWholeDim);
}

TEST(Spec, CanonicalReparsesToItself) {
  for (const char* t : {"fp32", "fp8_e5m2:gran=token,scale=2", "kivi3:g=16,r=32,sym",
                        "int4:k=channel,v=channel,g=128,r=256"}) {
    const std::string c = parse_spec(t).canonical();
    EXPECT_EQ(parse_spec(c).canonical(), c) << t;
  }
}

TEST(Spec, ErrorsNameTheBadPartAndListAllowed) {
  EXPECT_NE(error_of("foo").find("unknown scheme 'foo' (allowed: fp32"), std::string::npos);
  EXPECT_NE(error_of("fp8_e3m4").find("unknown FP8 format 'fp8_e3m4'"), std::string::npos);
  EXPECT_NE(error_of("fp8_e4m3:gran=row").find("gran=row (allowed: tensor, head, token, channel)"),
            std::string::npos);
  EXPECT_NE(error_of("fp8_e4m3:scale=-1").find("scale=-1"), std::string::npos);
  EXPECT_NE(error_of("fp8_e4m3:scale=calib:").find("needs a file"), std::string::npos);
  EXPECT_NE(error_of("fp8_e4m3:g=32")
                .find("unknown parameter 'g' for fp8_e4m3 (allowed: first, gran, scale)"),
            std::string::npos);
  EXPECT_NE(error_of("int5:k=token,v=token").find("5 bits not supported (allowed: 2, 3, 4, 8)"),
            std::string::npos);
  EXPECT_NE(error_of("kivi2:g=48").find("g=48 (allowed: a power of two from 8 to 256"),
            std::string::npos);
  EXPECT_NE(error_of("kivi2:g=512").find("g=512"), std::string::npos);
  EXPECT_NE(error_of("kivi2:g=32,r=100").find("r=100 must be a multiple of g=32"),
            std::string::npos);
  EXPECT_NE(error_of("int2:k=channel").find("needs both axes"), std::string::npos);
  EXPECT_NE(error_of("int2:v=token,g=64").find("needs both axes"), std::string::npos);
  EXPECT_NE(error_of("int4:g=64").find("needs both axes"), std::string::npos);
  EXPECT_NE(error_of("int2:k=row,v=token").find("k=row (allowed: channel, token)"),
            std::string::npos);
  EXPECT_NE(error_of("kivi2:k=token").find("unknown parameter 'k'"), std::string::npos);
  EXPECT_NE(error_of("bf16:gran=head").find("takes no parameters"), std::string::npos);
  EXPECT_NE(error_of("kivi2:g=32,g=64").find("given twice"), std::string::npos);
  EXPECT_NE(error_of("kivi2:").find("nothing after ':'"), std::string::npos);
  EXPECT_NE(error_of("").find("empty scheme spec"), std::string::npos);
  EXPECT_NE(error_of("kivi2:r=abc").find("r=abc is not an integer"), std::string::npos);
  // Per-token-only schemes need no R multiple of G.
  EXPECT_EQ(error_of("int2:k=token,v=token,g=32,r=100"), "");
}

// Issue 14: the names other tools use are spec aliases in every command (they used to work in
// `kvq plan --kv` only): vLLM's fp8 is E4M3; a bare int<B> takes KIVI's axes (keys per channel,
// values per token), as `kvq plan` always documented; with parameters both axes are named.
TEST(Spec, AliasesFromOtherTools_sameCanonicalSpec) {
  EXPECT_EQ(parse_spec("fp8").canonical(), parse_spec("fp8_e4m3").canonical());
  EXPECT_EQ(parse_spec("fp8:gran=head,scale=1").canonical(), "fp8_e4m3:gran=head,scale=1");
  EXPECT_EQ(parse_spec("int2").canonical(), "int2:k=channel,v=token,g=32,r=0");
  EXPECT_EQ(parse_spec("int8").canonical(), parse_spec("int8:k=channel,v=token").canonical());
}

// Issue 14: HF transformers' QuantizedCacheConfig names. By its documentation: nbits 4,
// q_group_size 64, residual_length 128 by default; axis 0 groups along head_dim (per token).
TEST(Spec, HfQuantizedCacheNames_mapToPerTokenInt) {
  EXPECT_EQ(parse_spec("hf").canonical(), "int4:k=token,v=token,g=64,r=128");
  EXPECT_EQ(parse_spec("hf:nbits=2,q_group_size=32,residual_length=64,axis_key=0,axis_value=0")
                .canonical(),
            "int2:k=token,v=token,g=32,r=64");
  EXPECT_NE(error_of("hf:axis_key=1").find("axis 0"), std::string::npos);
  EXPECT_NE(error_of("hf:nbits=5").find("5 bits"), std::string::npos);
  EXPECT_NE(error_of("hf:group=32").find("unknown parameter 'group'"), std::string::npos);
  EXPECT_EQ(parse_spec("k=hf;v=fp8").side(Role::Key).canonical(),
            "int4:k=token,v=token,g=64,r=128");
}

// Issue 14: keys and values in different schemes (llama.cpp's -ctk/-ctv). Expected strings are the
// grammar of core/spec.h written out by hand.
TEST(Spec, SplitKeysAndValues_eachSideIsItsOwnSpec) {
  const SchemeSpec s = parse_spec("k=kivi2;v=fp8_e4m3:gran=token");
  EXPECT_TRUE(s.split());
  EXPECT_EQ(s.canonical(), "k=kivi2:g=32,r=128;v=fp8_e4m3:gran=token,scale=dynamic");
  EXPECT_EQ(s.side(Role::Key).canonical(), "kivi2:g=32,r=128");
  EXPECT_EQ(s.side(Role::Value).canonical(), "fp8_e4m3:gran=token,scale=dynamic");
  EXPECT_EQ(s.side(Role::Value).kind, SchemeKind::Fp8);
  EXPECT_EQ(s.kind, SchemeKind::Int);  // the key side's fields
  EXPECT_EQ(parse_spec(s.canonical()).canonical(), s.canonical());
  // The comma form: the value side starts at the first ",v=" naming a scheme, not at an int
  // spec's own v=token.
  EXPECT_EQ(parse_spec("k=kivi2,v=fp8").canonical(), parse_spec("k=kivi2;v=fp8").canonical());
  EXPECT_EQ(parse_spec("k=int2:k=token,v=token,v=bf16").canonical(),
            "k=int2:k=token,v=token,g=32,r=0;v=bf16");
  EXPECT_EQ(parse_spec("k=bf16,v=int4:k=channel,v=channel").side(Role::Value).canonical(),
            "int4:k=channel,v=channel,g=32,r=0");
  // The same scheme on both sides is that scheme.
  EXPECT_FALSE(parse_spec("k=kivi4;v=kivi4").split());
  EXPECT_EQ(parse_spec("k=kivi4;v=kivi4").canonical(), "kivi4:g=32,r=128");
  EXPECT_NE(error_of("k=kivi2").find("k=KEY_SPEC;v=VALUE_SPEC"), std::string::npos);
  EXPECT_NE(error_of("v=fp8;k=kivi2").find("names the keys first"), std::string::npos);
  EXPECT_NE(error_of("k=kivi5;v=fp8").find("5 bits"), std::string::npos);
  EXPECT_NE(error_of("k=kivi2;v=fp8:gran=row").find("gran=row"), std::string::npos);
}

}  // namespace
}  // namespace kvq
