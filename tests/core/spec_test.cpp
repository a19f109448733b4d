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
  EXPECT_EQ(parse_spec("fp32").kind(), SchemeKind::Fp32);
  EXPECT_EQ(parse_spec("bf16").kind(), SchemeKind::Bf16);
  EXPECT_EQ(parse_spec("fp16").kind(), SchemeKind::Fp16);
}

TEST(Spec, Fp8DefaultsAreTensorDynamic) {
  const auto s = parse_spec("fp8_e4m3");
  EXPECT_EQ(s.kind(), SchemeKind::Fp8);
  EXPECT_EQ(s.fp8().format, Fp8Format::E4M3);
  EXPECT_EQ(s.fp8().gran, Granularity::Tensor);
  EXPECT_EQ(s.fp8().source, ScaleSource::Dynamic);
  EXPECT_EQ(s.canonical(), "fp8_e4m3:gran=tensor,scale=dynamic");
}

TEST(Spec, Fp8EveryGranularityAndSource) {
  EXPECT_EQ(parse_spec("fp8_e5m2:gran=channel").fp8().gran, Granularity::Channel);
  EXPECT_EQ(parse_spec("fp8_e4m3fnuz:gran=token").fp8().format, Fp8Format::E4M3FNUZ);
  const auto c = parse_spec("fp8_e4m3:gran=head,scale=0.25");
  EXPECT_EQ(c.fp8().source, ScaleSource::Constant);
  EXPECT_EQ(c.fp8().constant, 0.25f);
  EXPECT_EQ(c.canonical(), "fp8_e4m3:gran=head,scale=0.25");
  const auto k = parse_spec("fp8_e4m3:scale=calib:/tmp/s.json,gran=head");
  EXPECT_EQ(k.fp8().source, ScaleSource::Calib);
  EXPECT_EQ(k.fp8().calib_path, "/tmp/s.json");
}

TEST(Spec, KiviDefaultsG32R128) {
  const auto s = parse_spec("kivi2");
  EXPECT_EQ(s.kind(), SchemeKind::Int);
  EXPECT_EQ(s.q().bits, 2);
  EXPECT_EQ(s.q().group, 32);
  EXPECT_EQ(s.q().residual, 128);
  EXPECT_EQ(s.q().key_axis, Axis::Channel);
  EXPECT_EQ(s.q().value_axis, Axis::Token);
  EXPECT_EQ(s.canonical(), "kivi2:g=32,r=128");
  EXPECT_EQ(parse_spec("kivi4:g=64,r=64").canonical(), "kivi4:g=64,r=64");
}

TEST(Spec, IntNeedsAxesAndDefaultsR0) {
  const auto s = parse_spec("int3:k=token,v=channel,g=16,sym");
  EXPECT_EQ(s.q().bits, 3);
  EXPECT_EQ(s.q().key_axis, Axis::Token);
  EXPECT_EQ(s.q().value_axis, Axis::Channel);
  EXPECT_EQ(s.q().group, 16);
  EXPECT_EQ(s.q().residual, 0);
  EXPECT_TRUE(s.q().sym);
  EXPECT_EQ(s.canonical(), "int3:k=token,v=channel,g=16,r=0,sym");
  EXPECT_EQ(parse_spec("int8:k=token,v=token,g=dim").q().group, kGroupWholeDim);
}

// Issue 15: rot=hadamard[:SEED] and sink=S on every scheme; canonical names carry them only when
// set (the names of earlier results stay), and both sides of a split spec share one S.
TEST(Spec, RotationAndSinks) {
  const SchemeSpec a = parse_spec("kivi2:rot=hadamard:7,sink=4");
  EXPECT_TRUE(a.rot.on);
  EXPECT_TRUE(a.rot.seeded);
  EXPECT_EQ(a.rot.seed, 7u);
  EXPECT_EQ(a.sink, 4);
  EXPECT_EQ(a.canonical(), "kivi2:g=32,r=128,rot=hadamard:7,sink=4");
  EXPECT_EQ(a.base().canonical(), "kivi2:g=32,r=128");
  EXPECT_EQ(parse_spec("bf16:sink=2").canonical(), "bf16:sink=2");
  EXPECT_EQ(parse_spec("fp32:rot=hadamard").canonical(), "fp32:rot=hadamard");
  EXPECT_EQ(parse_spec("fp8:gran=token,rot=hadamard").canonical(),
            "fp8_e4m3:gran=token,scale=dynamic,rot=hadamard");
  EXPECT_FALSE(parse_spec("kivi2:rot=hadamard").rot.seeded);
  EXPECT_EQ(parse_spec("kivi2:sink=0").canonical(), "kivi2:g=32,r=128");
  const SchemeSpec s = parse_spec("k=kivi2:sink=4;v=fp8:gran=token,sink=4,rot=hadamard");
  EXPECT_EQ(s.side(Role::Key).sink, 4);
  EXPECT_FALSE(s.side(Role::Key).rot.on);
  EXPECT_TRUE(s.side(Role::Value).rot.on);
  EXPECT_EQ(with_rotation(parse_spec("kivi2"), RotSpec{true}).canonical(),
            "kivi2:g=32,r=128,rot=hadamard");
  EXPECT_EQ(with_rotation(s, RotSpec{true, true, 3}).canonical(),
            "k=kivi2:g=32,r=128,rot=hadamard:3,sink=4;v=fp8_e4m3:gran=token,scale=dynamic,"
            "rot=hadamard,sink=4");
  EXPECT_EQ(with_rotation(parse_spec("kivi2@1=k=kivi4;v=fp16"), RotSpec{true}).canonical(),
            "kivi2:g=32,r=128,rot=hadamard@1=k=kivi4:g=32,r=128,rot=hadamard;v=fp16:rot=hadamard");
  EXPECT_NE(error_of("fp8:scale=calib:s.json,rot=hadamard").find("measured on unrotated channels"),
            std::string::npos);
  EXPECT_NE(error_of("kivi2:rot=random").find("rot=random (allowed: hadamard, hadamard:SEED)"),
            std::string::npos);
  EXPECT_NE(error_of("kivi2:rot=hadamard:x").find("the seed is a non-negative integer"),
            std::string::npos);
  EXPECT_NE(error_of("kivi2:rot=hadamard:").find("the seed is a non-negative integer"),
            std::string::npos);
  EXPECT_NE(error_of("kivi2:sink=-1").find("sink=-1 (allowed: 0 .. 4096 tokens)"),
            std::string::npos);
  EXPECT_NE(error_of("kivi2:sink").find("needs a value"), std::string::npos);
  EXPECT_NE(error_of("k=kivi2:sink=4;v=kivi4").find("sink= is 4 for keys and 0 for values"),
            std::string::npos);
}

// Per-layer specs (issue 15): SPEC@LAYERS=SPEC, grouped by scheme, layers sorted and written as
// ranges; a layer that names the first spec is dropped; a layer given twice is an error.
TEST(Spec, PerLayerSchemes) {
  const SchemeSpec s = parse_spec("kivi2@29,0-1=kivi4@5=fp8@3=kivi4@7=kivi2");
  EXPECT_EQ(s.canonical(),
            "kivi2:g=32,r=128@0-1,3,29=kivi4:g=32,r=128@5=fp8_e4m3:gran=tensor,scale=dynamic");
  EXPECT_EQ(parse_spec(s.canonical()).canonical(), s.canonical());
  EXPECT_EQ(s.for_layer(0).canonical(), "kivi4:g=32,r=128");
  EXPECT_EQ(s.for_layer(4).canonical(), "kivi2:g=32,r=128");
  EXPECT_EQ(s.for_layer(5).canonical(), "fp8_e4m3:gran=tensor,scale=dynamic");
  EXPECT_EQ(s.for_layer(7).canonical(), "kivi2:g=32,r=128");
  EXPECT_FALSE(s.for_layer(3).layered());
  EXPECT_EQ(s.max_layer(), 29);
  EXPECT_EQ(s.distinct_layer_specs().size(), 3u);
  EXPECT_EQ(parse_spec("fp32@3=k=kivi2;v=fp16").for_layer(3).canonical(),
            "k=kivi2:g=32,r=128;v=fp16");
  EXPECT_NE(error_of("kivi2@1=kivi4@1=fp8").find("layer 1 is given twice"), std::string::npos);
  EXPECT_NE(error_of("kivi2@x=kivi4").find("'x' is not a layer index"), std::string::npos);
  EXPECT_NE(error_of("kivi2@3-1=kivi4").find("runs backwards"), std::string::npos);
  EXPECT_NE(error_of("kivi2@kivi4").find("should be @LAYERS=SPEC"), std::string::npos);
  EXPECT_NE(error_of("kivi2@1=int9").find("9 bits not supported"), std::string::npos);
}

// Layer presets (issue 49 item 5): SPEC@first=F,last=L keeps the first F and last L layers in the
// exact fp32 cache; explicit @LAYERS=SPEC overrides win; last= needs the model's layer count.
TEST(Spec, LayerPresetFirstLast_parsesRoundTripsAndResolvesFor30Layers) {
  const SchemeSpec s = parse_spec("kivi2@15=kivi4@last=2,first=2@0=kivi4@1=kivi2");
  EXPECT_EQ(s.canonical(),
            "kivi2:g=32,r=128@first=2,last=2@0,15=kivi4:g=32,r=128@1=kivi2:g=32,r=128");
  EXPECT_EQ(parse_spec(s.canonical()).canonical(), s.canonical());
  EXPECT_TRUE(s.layered());
  EXPECT_EQ(s.max_layer(), 15);  // explicit overrides only
  EXPECT_EQ(parse_spec("kivi4@first=1").canonical(), "kivi4:g=32,r=128@first=1");
  EXPECT_EQ(parse_spec("kivi4@last=3").canonical(), "kivi4:g=32,r=128@last=3");
  EXPECT_NE(parse_spec("kivi2@first=2").canonical(), parse_spec("kivi2").canonical());
  // Without the layer count: first= answers, a layer last= might cover is an error.
  EXPECT_EQ(s.for_layer(-1).canonical(), "kivi2:g=32,r=128");
  EXPECT_EQ(parse_spec("kivi2@first=2").for_layer(1).canonical(), "fp32");
  EXPECT_EQ(parse_spec("kivi2@first=2").for_layer(2).canonical(), "kivi2:g=32,r=128");
  try {
    (void)s.for_layer(5);
    ADD_FAILURE() << "last= resolved without a layer count";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("depends on the model's layer count"), std::string::npos)
        << e.what();
  }
  // Resolved for a 30-layer model (SmolLM2-135M), the expected list written out by hand: layer 0
  // kivi4 (explicit wins over first=2), 1 kivi2 (explicit, although it repeats the first spec),
  // 15 kivi4, 28-29 fp32 (last=2), every other layer kivi2.
  const SchemeSpec r = resolve_layers(s, 30, "the model");
  EXPECT_EQ(r.canonical(), s.canonical());
  std::vector<std::string> want(30, "kivi2:g=32,r=128");
  want[0] = want[15] = "kivi4:g=32,r=128";
  want[28] = want[29] = "fp32";
  for (int l = 0; l < 30; ++l) EXPECT_EQ(r.for_layer(l).canonical(), want[l]) << "layer " << l;
  const SchemeSpec plain = resolve_layers(parse_spec("kivi2@first=2,last=2"), 30, "the model");
  for (int l = 0; l < 30; ++l)
    EXPECT_EQ(plain.for_layer(l).canonical(), l < 2 || l >= 28 ? "fp32" : "kivi2:g=32,r=128")
        << "layer " << l;
  EXPECT_EQ(plain.distinct_layer_specs().size(), 2u);
  // The model's --hadamard rotates the quantized layers; the kept ones stay the plain exact cache.
  const SchemeSpec rot = with_rotation(plain, RotSpec{true});
  EXPECT_EQ(rot.canonical(), "kivi2:g=32,r=128,rot=hadamard@first=2,last=2");
  EXPECT_EQ(rot.for_layer(29).canonical(), "fp32");
  EXPECT_EQ(rot.for_layer(2).canonical(), "kivi2:g=32,r=128,rot=hadamard");
}

TEST(Spec, LayerPresetErrors) {
  auto resolve_error = [](const char* spec, int layers) -> std::string {
    try {
      (void)resolve_layers(parse_spec(spec), layers, "the model");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(resolve_error("kivi2@first=15,last=15", 30).find("none would be quantized"),
            std::string::npos);
  EXPECT_NE(resolve_error("kivi2@first=31", 30).find("has 30 layers"), std::string::npos);
  EXPECT_EQ(resolve_error("kivi2@first=15,last=14", 30), "");
  EXPECT_NE(resolve_error("kivi2@first=2@30=kivi4", 30).find("names layer 30"), std::string::npos);
  EXPECT_NE(error_of("kivi2@first=2@first=3").find("first= is given twice"), std::string::npos);
  EXPECT_NE(error_of("kivi2@last=2,last=2").find("last= is given twice"), std::string::npos);
  EXPECT_NE(error_of("kivi2@first=0").find("takes a layer count 1-4095"), std::string::npos);
  EXPECT_NE(error_of("kivi2@first=2=kivi4").find("takes a layer count"), std::string::npos);
  EXPECT_NE(error_of("kivi2@first=2,window=1").find("a layer preset is first=N[,last=N]"),
            std::string::npos);
}

TEST(Spec, CanonicalReparsesToItself) {
  for (const char* t : {"fp32", "fp8_e5m2:gran=token,scale=2", "kivi3:g=16,r=32,sym",
                        "int4:k=channel,v=channel,g=128,r=256", "bf16:rot=hadamard:1,sink=3",
                        "int2:k=token,v=token,sink=16,rot=hadamard"}) {
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
                .find("unknown parameter 'g' for fp8_e4m3 (allowed: first, gran, rot, scale, sink)"),
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
  EXPECT_NE(error_of("bf16:gran=head").find("unknown parameter 'gran' for bf16 (allowed: rot, sink)"),
            std::string::npos);
  EXPECT_NE(error_of("kivi2:g=32,g=64").find("given twice"), std::string::npos);
  EXPECT_NE(error_of("kivi2:").find("nothing after ':'"), std::string::npos);
  // Issue 50 item 14: a comma for the colon read as "2,rot=hadamard bits not supported"
  EXPECT_NE(error_of("kivi2,rot=hadamard").find("parameters follow a ':' after the name "
                                                "(kivi2:rot=hadamard)"),
            std::string::npos);
  EXPECT_NE(error_of("fp8_e4m3,gran=head").find("(fp8_e4m3:gran=head)"), std::string::npos);
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
  EXPECT_EQ(s.side(Role::Value).kind(), SchemeKind::Fp8);
  EXPECT_EQ(s.kind(), SchemeKind::Int);  // the key side's fields
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
