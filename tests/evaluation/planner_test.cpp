// kvq plan's numbers, checked against the design note (REFERENCE.md sections 1 and 5) and
// against byte counts worked out by hand.
#include "evaluation/planner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/footprint.h"
#include "tests/support/expect_error.h"

namespace kvq::planner {
namespace {

PlanInput design_note(std::vector<std::string> kv = {"bf16", "fp8"}) {
  PlanInput in;
  in.model = model_preset("llama-3.1-8b");
  in.gpu = gpu_preset("h100-sxm");
  in.kv = std::move(kv);
  return in;  // defaults: 55 GB, 4,096-token requests, decode batch 64 x 2,000 tokens
}

using kvq::testing::expect_error;

// The design note: Llama 3.1 8B, 32 layers x 8 kv heads x 128 dims.
//   BF16: 32 * 8 * 128 * 2 (K and V) * 2 B = 131,072 B = 128 KiB per token.
//   FP8:  32 * 8 * 128 * 2 * 1 B = 65,536 B per token, plus one fp32 per-tensor scale per layer
//         tensor: 32 layers * 2 * 4 B = 256 B per request, 256 / 4,096 = 0.0625 B per token.
//   Tokens in 55e9 B: 55e9 / 131,072 = 419,616.7 -> ~419,617;
//                     55e9 / 65,536.0625 = 839,232.6 -> ~839,233 (55e9 / 65,536 = 839,233.4).
//   4,096-token requests: 419,616.7 / 4,096 = 102.4 -> 102; 839,232.6 / 4,096 = 204.9 -> 204.
//   Decode batch 64 x 2,000: 64 * 2,000 * 131,072 = 16,777,216,000 B = 16.8 GB;
//                            64 * (2,000 * 65,536 + 256) = 8,388,624,384 B = 8.4 GB.
//   Step bound with 8.03e9 * 2 = 16.06e9 B of weights at 3.35e12 B/s:
//     (16.06e9 + 16.777e9) / 3.35e12 = 9.802 ms; (16.06e9 + 8.389e9) / 3.35e12 = 7.298 ms.
TEST(planner, DesignNoteBf16AndFp8) {
  const Plan p = make_plan(design_note());
  ASSERT_EQ(p.rows.size(), 2u);
  const PlanRow& bf16 = p.rows[0];
  const PlanRow& fp8 = p.rows[1];
  EXPECT_DOUBLE_EQ(p.weight_bytes, 16.06e9);

  EXPECT_EQ(bf16.bytes_per_token, 131072.0);
  EXPECT_EQ(bf16.request_bytes, 131072.0 * 4096);
  EXPECT_DOUBLE_EQ(*bf16.effective_bits, 16.0);
  EXPECT_NEAR(bf16.tokens_in_mem, 419616.7, 0.05);
  EXPECT_EQ(std::llround(bf16.tokens_in_mem), 419617);
  EXPECT_EQ(bf16.requests, 102);
  EXPECT_EQ(bf16.decode_kv_bytes, 16777216000.0);
  EXPECT_NEAR(bf16.step_seconds * 1e3, 9.802, 5e-4);
  EXPECT_EQ(bf16.speedup, 1.0);

  EXPECT_EQ(fp8.spec, "fp8_e4m3:gran=tensor,scale=dynamic");
  EXPECT_EQ(fp8.bytes_per_token, 65536.0625);
  EXPECT_EQ(std::llround(fp8.bytes_per_token), 65536);
  EXPECT_NEAR(*fp8.effective_bits, 8.0, 1e-5);
  EXPECT_NEAR(fp8.tokens_in_mem, 839232.6, 0.05);
  EXPECT_EQ(std::llround(fp8.tokens_in_mem), 839233);
  EXPECT_EQ(fp8.requests, 204);
  EXPECT_EQ(fp8.decode_kv_bytes, 8388624384.0);
  EXPECT_NEAR(fp8.step_seconds * 1e3, 7.298, 5e-4);
  EXPECT_DOUBLE_EQ(fp8.speedup, bf16.step_seconds / fp8.step_seconds);

  // The note's "16 GB of weights" rounds to the same step bounds.
  PlanInput in16 = design_note();
  in16.weight_bytes = 16e9;
  const Plan p16 = make_plan(in16);
  EXPECT_EQ(fmt::format("{:.1f}", p16.rows[0].step_seconds * 1e3), "9.8");
  EXPECT_EQ(fmt::format("{:.1f}", p16.rows[1].step_seconds * 1e3), "7.3");
}

// Issue 14: keys and values in different schemes. By hand for Llama 3.1 8B (32 layers, 8 kv heads,
// 128 channels): bf16 keys 32 * 8 * 128 * 2 B = 65,536 B per token; fp8 values per tensor with a
// dynamic scale: 32 * 8 * 128 * 1 B = 32,768 B per token + 32 layers * 4 B per request.
TEST(planner, SplitSpecAddsEachSidesBytes) {
  PlanInput in = design_note();
  in.kv = {"k=bf16;v=fp8"};
  const Plan p = make_plan(in);
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_EQ(p.rows[0].spec, "k=bf16;v=fp8_e4m3:gran=tensor,scale=dynamic");
  EXPECT_DOUBLE_EQ(p.rows[0].request_bytes, (65536.0 + 32768.0) * 4096 + 32 * 4);
}

TEST(planner, DesignNoteTablePrintsTheNotesNumbers) {
  const std::string t = format_plan(make_plan(design_note()));
  for (const char* s : {"419,617", "839,233", " 102 ", " 204 ", "16.8", " 8.4 ", " 9.8 ", " 7.3 ",
                        "128.00", "64.00", "3.35 TB/s", "16.06 GB"})
    EXPECT_NE(t.find(s), std::string::npos) << "missing '" << s << "' in\n" << t;
}

// kivi2:g=32,r=128 on Llama 3.1 8B (H = 8, D = 128: 1,024 elements per token per layer tensor).
// One quantized token of one layer tensor: 1,024 codes x 2 bits = 256 B, plus 1,024 / 32 = 32
// groups x (fp16 scale + fp16 zero) = 128 B -> 384 B = 3 bits per element. A full-precision
// token: 1,024 x 2 B = 2,048 B.
// A 4,096-token request, per layer:
//   K (per-channel, flushed every R = 128 tokens): 4,096 = 32 x 128, all quantized:
//     4,096 x 384 = 1,572,864 B (codes 1,048,576 + scales 262,144 + zeros 262,144).
//   V (per-token, the last R = 128 tokens full precision): 3,968 x 384 + 128 x 2,048
//     = 1,523,712 + 262,144 = 1,785,856 B.
//   Layer: 3,358,720 B; x 32 layers = 107,479,040 B; / 4,096 = 26,240 B per token (25.625 KiB).
//   55e9 / 26,240 = 2,096,036.6 tokens; 55e9 / 107,479,040 = 511.7 -> 511 requests.
// A 2,000-token decode request, per layer:
//   K: floor(2,000 / 128) x 128 = 1,920 quantized, 80 full: 1,920 x 384 + 80 x 2,048 = 901,120 B.
//   V: 1,872 quantized, 128 full: 1,872 x 384 + 128 x 2,048 = 980,992 B.
//   Request: 32 x 1,882,112 = 60,227,584 B; batch of 64: 3,854,565,376 B.
// Per-layer specs (issue 15): kivi2 with layers 0-1 in kivi4, a 4,096-token request. kivi4 per
// quantized token-layer: 1,024 x 4 bits = 512 B + 32 groups x 4 B = 640 B. K: 4,096 x 640 =
// 2,621,440 B; V: 3,968 x 640 + 128 x 2,048 = 2,801,664 B; kivi4 layer 5,423,104 B. Request:
// 30 x 3,358,720 (the kivi2 layer above) + 2 x 5,423,104 = 111,607,808 B.
TEST(planner, PerLayerSpecSumsEachLayersScheme) {
  const ModelDims m = model_preset("llama-3.1-8b");
  EXPECT_EQ(request_footprint(m, parse_kv("kivi2:g=32,r=128@0-1=kivi4:g=32,r=128"), 4096)
                .total_bytes(),
            111607808.0);
  try {
    (void)request_footprint(m, parse_kv("kivi2@32=kivi4"), 4096);
    FAIL() << "layer 32 of a 32-layer model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("names layer 32, but llama-3.1-8b has 32 layers (0-31)"),
              std::string::npos)
        << e.what();
  }
}

TEST(planner, Kivi2HandComputed) {
  const ModelDims m = model_preset("llama-3.1-8b");
  const SchemeSpec spec = parse_kv("kivi2:g=32,r=128");
  const RequestFootprint f = request_footprint(m, spec, 4096);  // summed over the 32 layers
  EXPECT_EQ(f.key.code_bytes, 32 * 1048576.0);
  EXPECT_EQ(f.key.scale_bytes, 32 * 262144.0);
  EXPECT_EQ(f.key.zero_bytes, 32 * 262144.0);
  EXPECT_EQ(f.key.residual_bytes, 0.0);
  EXPECT_EQ(f.value.total_bytes(), 32 * 1785856.0);
  EXPECT_EQ(f.value.residual_bytes, 32 * 262144.0);
  EXPECT_EQ(f.total_bytes(), 107479040.0);
  EXPECT_DOUBLE_EQ(*f.effective_bits(), 3.0);
  EXPECT_EQ(request_footprint(m, spec, 2000).total_bytes(), 60227584.0);

  const Plan p = make_plan(design_note({"bf16", "kivi2:g=32,r=128"}));
  const PlanRow& r = p.rows[1];
  EXPECT_EQ(r.spec, "kivi2:g=32,r=128");
  EXPECT_EQ(r.bytes_per_token, 26240.0);
  EXPECT_EQ(std::llround(r.tokens_in_mem), 2096037);
  EXPECT_EQ(r.requests, 511);
  EXPECT_EQ(r.decode_kv_bytes, 3854565376.0);
  EXPECT_NEAR(r.step_seconds, (16.06e9 + 3854565376.0) / 3.35e12, 1e-15);
  // A kivi2 alias with the defaults is the same scheme.
  EXPECT_EQ(make_plan(design_note({"kivi2"})).rows[0].request_bytes, r.request_bytes);
}

// int4 (alias of int4:k=channel,v=token,g=32,r=0): a token of one layer tensor is 1,024 x 4 bits
// = 512 B + 32 groups x 4 B = 128 B -> 640 B (5 bits per element), no residual window.
//   4,096 tokens: K and V all quantized: 32 layers x 2 x 640 = 40,960 B per token (40 KiB).
//   55e9 / 40,960 = 1,342,773.4 tokens; / 4,096 = 327.8 -> 327 requests.
//   2,000 tokens: K flushes every G = 32 tokens: 1,984 quantized + 16 at 2 B:
//     1,984 x 640 + 16 x 2,048 = 1,302,528 B; V: 2,000 x 640 = 1,280,000 B;
//     32 x 2,582,528 = 82,640,896 B per request.
TEST(planner, Int4HandComputed) {
  const Plan p = make_plan(design_note({"int4"}));
  const PlanRow& r = p.rows[0];
  EXPECT_EQ(r.spec, "int4:k=channel,v=token,g=32,r=0");
  EXPECT_EQ(r.bytes_per_token, 40960.0);
  EXPECT_DOUBLE_EQ(*r.effective_bits, 5.0);
  EXPECT_EQ(std::llround(r.tokens_in_mem), 1342773);
  EXPECT_EQ(r.requests, 327);
  EXPECT_EQ(r.decode_kv_bytes, 64 * 82640896.0);
  // Against bf16 (not listed; same batch of 64): its 2,000-token request is 2,000 x 131,072 B.
  EXPECT_DOUBLE_EQ(r.speedup, (16.06e9 + 64 * 2000 * 131072.0) / (16.06e9 + 64 * 82640896.0));
}

// Every row is layers x (footprint(K) + footprint(V)) at the request length: the one formula.
TEST(planner, RowsUseTheFootprintFormula) {
  const std::vector<std::string> kv = {
      "bf16", "fp16", "fp8:gran=head",   "fp8_e5m2:gran=token",
      "int8", "int2", "kivi4:g=64,r=64", "int4:k=token,v=token,g=dim"};
  PlanInput in = design_note(kv);
  in.model = model_preset("qwen2.5-7b");
  in.ctx = 1000;  // not a multiple of any group
  in.decode_ctx = 333;
  const Plan p = make_plan(in);
  ASSERT_EQ(p.rows.size(), kv.size());
  for (size_t i = 0; i < kv.size(); ++i) {
    const SchemeSpec s = parse_kv(kv[i]);
    auto bytes = [&](int64_t n) {
      const Shape3 shape{n, 4, 128};
      return 28.0 * (footprint(s, Role::Key, shape).total_bytes() +
                     footprint(s, Role::Value, shape).total_bytes());
    };
    EXPECT_EQ(p.rows[i].request_bytes, bytes(1000)) << kv[i];
    EXPECT_EQ(p.rows[i].bytes_per_token, bytes(1000) / 1000) << kv[i];
    EXPECT_EQ(p.rows[i].requests, static_cast<int64_t>(std::floor(55e9 / bytes(1000)))) << kv[i];
    EXPECT_EQ(p.rows[i].decode_kv_bytes, 64 * bytes(333)) << kv[i];
    EXPECT_GT(p.rows[i].step_seconds, 0.0) << kv[i];
  }
}

// A request shorter than the residual window quantizes nothing: bf16 bytes, no effective bits.
TEST(planner, RequestInsideTheResidualWindow) {
  PlanInput in = design_note({"bf16", "kivi2"});
  in.ctx = 100;
  const Plan p = make_plan(in);
  EXPECT_EQ(p.rows[1].bytes_per_token, p.rows[0].bytes_per_token);
  EXPECT_FALSE(p.rows[1].effective_bits.has_value());
  EXPECT_NE(format_plan(p).find("n/a"), std::string::npos);
  EXPECT_TRUE(plan_json(p)["rows"][1]["effective_bits"].is_null());
}

// Custom dims, SmolLM2-135M's: 30 layers x 3 kv heads x 64 dims x 2 x 2 B = 23,040 B per token.
TEST(planner, CustomModel) {
  ModelArgs a;
  a.layers = 30;
  a.kv_heads = 3;
  a.head_dim = 64;
  a.params_billions = 0.135;
  const ModelDims m = resolve_model(a, false);
  EXPECT_EQ(m.name, "custom");
  EXPECT_EQ(m.layers, 30);
  EXPECT_DOUBLE_EQ(m.params, 0.135e9);
  PlanInput in = design_note({"bf16"});
  in.model = m;
  in.gpu = resolve_gpu(std::nullopt, 0.3);
  const Plan p = make_plan(in);
  EXPECT_EQ(p.rows[0].bytes_per_token, 23040.0);
  EXPECT_DOUBLE_EQ(p.weight_bytes, 0.27e9);
  EXPECT_DOUBLE_EQ(in.gpu.bandwidth, 0.3e12);
  EXPECT_EQ(in.gpu.name, "custom");

  // The same dims as the preset give the same row.
  in.model = model_preset("smollm2-135m");
  EXPECT_EQ(make_plan(in).rows[0].request_bytes, p.rows[0].request_bytes);

  // --params may be left out when the weight bytes are given.
  a.params_billions.reset();
  EXPECT_EQ(resolve_model(a, true).params, 0.0);
  in.model = resolve_model(a, true);
  in.weight_bytes = 1e9;
  EXPECT_DOUBLE_EQ(make_plan(in).weight_bytes, 1e9);
  in.weight_bytes.reset();
  expect_error([&] { make_plan(in); }, "--params or --weights-bytes");
}

TEST(planner, NoArgumentsMeansTheDesignNote) {
  const ModelDims m = resolve_model(ModelArgs{}, false);
  EXPECT_EQ(m.name, "llama-3.1-8b");
  const Gpu g = resolve_gpu(std::nullopt, std::nullopt);
  EXPECT_EQ(g.name, "h100-sxm");
  EXPECT_EQ(g.bandwidth, 3.35e12);
  const PlanInput in;
  EXPECT_EQ(in.mem_bytes, 55e9);
  EXPECT_EQ(in.ctx, 4096);
  EXPECT_EQ(in.batch, 64);
  EXPECT_EQ(in.decode_ctx, 2000);
  ASSERT_GE(in.kv.size(), 2u);
  EXPECT_EQ(in.kv[0], "bf16");
  EXPECT_EQ(in.kv[1], "fp8");
}

TEST(planner, PresetsMatchTheReference) {
  struct M {
    const char* name;
    int64_t l, h, d;
    double params;
  };
  const M want[] = {{"llama-3.1-8b", 32, 8, 128, 8.03e9}, {"llama-3.1-70b", 80, 8, 128, 70.6e9},
                    {"llama-2-7b", 32, 32, 128, 6.74e9},  {"mistral-7b", 32, 8, 128, 7.24e9},
                    {"qwen2.5-7b", 28, 4, 128, 7.62e9},   {"smollm2-135m", 30, 3, 64, 0.135e9}};
  ASSERT_EQ(model_presets().size(), std::size(want));
  for (const M& w : want) {
    const ModelDims& m = model_preset(w.name);
    EXPECT_EQ(m.layers, w.l) << w.name;
    EXPECT_EQ(m.kv_heads, w.h) << w.name;
    EXPECT_EQ(m.head_dim, w.d) << w.name;
    EXPECT_DOUBLE_EQ(m.params, w.params) << w.name;
  }
  EXPECT_EQ(gpu_preset("h100-sxm").mem_bytes, 80e9);
  EXPECT_EQ(gpu_preset("h200").mem_bytes, 141e9);
  EXPECT_EQ(gpu_preset("h200").bandwidth, 4.8e12);
  EXPECT_EQ(gpu_preset("a100-80gb").bandwidth, 2.0e12);
  EXPECT_EQ(gpu_preset("l4").mem_bytes, 24e9);
  EXPECT_EQ(gpu_preset("l4").bandwidth, 0.3e12);
}

TEST(planner, KvAliases) {
  EXPECT_EQ(parse_kv("fp8").canonical(), "fp8_e4m3:gran=tensor,scale=dynamic");
  EXPECT_EQ(parse_kv("fp8:gran=head").canonical(), "fp8_e4m3:gran=head,scale=dynamic");
  EXPECT_EQ(parse_kv("int2").canonical(), "int2:k=channel,v=token,g=32,r=0");
  EXPECT_EQ(parse_kv("int8").canonical(), "int8:k=channel,v=token,g=32,r=0");
  EXPECT_EQ(parse_kv("kivi2").canonical(), "kivi2:g=32,r=128");
  EXPECT_EQ(parse_kv("int4:k=token,v=token,g=64").canonical(), "int4:k=token,v=token,g=64,r=0");
  EXPECT_EQ(parse_kv("bf16").kind(), SchemeKind::Bf16);
}

TEST(planner, ParseGb) {
  EXPECT_EQ(parse_gb("55", "--mem"), 55e9);
  EXPECT_EQ(parse_gb("55GB", "--mem"), 55e9);
  EXPECT_DOUBLE_EQ(parse_gb("16.06 gb", "--mem"), 16.06e9);
  EXPECT_EQ(parse_gb("80GiB", "--mem"), 80.0 * 1073741824.0);
  EXPECT_EQ(parse_gb("500MB", "--mem"), 500e6);
  EXPECT_EQ(parse_gb("1e3B", "--mem"), 1e3);
  EXPECT_EQ(parse_gb("0", "--weights-bytes", true), 0.0);
  expect_error([] { parse_gb("0", "--mem"); }, "--mem '0'");
  expect_error([] { parse_gb("-1", "--mem"); }, "--mem '-1'");
  expect_error([] { parse_gb("-1", "--weights-bytes", true); }, "--weights-bytes '-1'");
  expect_error([] { parse_gb("abc", "--mem"); }, "'abc' is not a size");
  expect_error([] { parse_gb("55XB", "--mem"); }, "'55XB'");
  expect_error([] { parse_gb("", "--mem"); }, "--mem");
  expect_error([] { parse_gb("inf", "--mem"); }, "'inf'");
  expect_error([] { parse_gb("nan", "--mem"); }, "'nan'");
}

TEST(planner, GroupThousands) {
  EXPECT_EQ(group_thousands(0), "0");
  EXPECT_EQ(group_thousands(999), "999");
  EXPECT_EQ(group_thousands(1000), "1,000");
  EXPECT_EQ(group_thousands(419617), "419,617");
  EXPECT_EQ(group_thousands(2096037), "2,096,037");
  EXPECT_EQ(group_thousands(-1234567), "-1,234,567");
}

TEST(planner, Errors) {
  expect_error([] { model_preset("llama-4"); },
               "unknown model preset 'llama-4' (allowed: llama-3.1-8b");
  expect_error([] { gpu_preset("b200"); }, "unknown gpu preset 'b200' (allowed: h100-sxm");
  expect_error([] { resolve_gpu(std::string("h200"), 4.8); }, "not both");
  expect_error([] { resolve_gpu(std::nullopt, 0.0); }, "--bandwidth 0");
  expect_error([] { resolve_gpu(std::nullopt, -3.0); }, "--bandwidth -3");

  ModelArgs a;
  a.layers = 32;
  expect_error([&] { resolve_model(a, false); }, "missing --kv-heads, --head-dim, --params");
  a.kv_heads = 8;
  a.head_dim = 128;
  expect_error([&] { resolve_model(a, false); }, "missing --params");
  a.params_billions = 8.03;
  a.layers = 0;
  expect_error([&] { resolve_model(a, false); }, "--layers 0");
  a.layers = 32;
  a.head_dim = -128;
  expect_error([&] { resolve_model(a, false); }, "--head-dim -128");
  a.head_dim = 128;
  a.params_billions = -1;
  expect_error([&] { resolve_model(a, false); }, "--params -1");
  a.params_billions = 8.03;
  a.preset = "llama-3.1-8b";
  expect_error([&] { resolve_model(a, false); }, "--model llama-3.1-8b cannot be combined");

  auto with = [](auto change) {
    PlanInput in = design_note();
    change(in);
    return [in] { make_plan(in); };
  };
  expect_error(with([](PlanInput& in) { in.ctx = 0; }), "--ctx 0");
  expect_error(with([](PlanInput& in) { in.batch = -2; }), "--batch -2");
  expect_error(with([](PlanInput& in) { in.decode_ctx = 0; }), "--decode-ctx 0");
  expect_error(with([](PlanInput& in) { in.mem_bytes = 0; }), "--mem");
  expect_error(with([](PlanInput& in) { in.weight_bytes = -1.0; }), "--weights-bytes -1");
  expect_error(with([](PlanInput& in) { in.kv.clear(); }), "--kv needs");
  expect_error(with([](PlanInput& in) { in.kv = {"bf16", "kivi5"}; }), "kivi5");
  expect_error(with([](PlanInput& in) { in.kv = {"int4:g=64"}; }), "int4:g=64");
  expect_error(with([](PlanInput& in) { in.kv = {"fp9"}; }), "unknown scheme 'fp9'");
  expect_error(with([](PlanInput& in) { in.model.kv_heads = 0; }), "--kv-heads 0");
  expect_error(with([](PlanInput& in) { in.ctx = int64_t{1} << 50; }), "too large to plan");
}

TEST(planner, NotesWhenThingsDoNotFit) {
  PlanInput in = design_note({"bf16"});
  in.mem_bytes = 70e9;  // 16.06 GB of weights + 70 GB > the H100's 80 GB
  in.batch = 1000;      // 1,000 x 2,000 tokens x 128 KiB = 262 GB of KV > 70 GB
  in.ctx = 1 << 20;     // one 1 Mi-token request is 137 GB
  const Plan p = make_plan(in);
  ASSERT_EQ(p.notes.size(), 3u);
  EXPECT_EQ(p.rows[0].requests, 0);
  const std::string t = format_plan(p);
  EXPECT_NE(t.find("note: bf16: one 1,048,576-token request"), std::string::npos) << t;
  EXPECT_NE(t.find("more than the h100-sxm's 80 GB"), std::string::npos) << t;
  // 70 GB / (2,000 x 131,072 B) = 267 requests fit: the batch of 1,000 is capped, and said so.
  EXPECT_EQ(p.rows[0].decode_batch, 267);
  EXPECT_NE(t.find("its decode batch is 267, not --batch 1,000"), std::string::npos) << t;
  EXPECT_EQ(make_plan(design_note()).notes.size(), 0u);
}

TEST(planner, JsonHasTheNumbers) {
  const nlohmann::json j = plan_json(make_plan(design_note()));
  EXPECT_EQ(j["model"]["name"], "llama-3.1-8b");
  EXPECT_EQ(j["model"]["layers"], 32);
  EXPECT_EQ(j["gpu"]["bandwidth_bytes_per_s"], 3.35e12);
  EXPECT_EQ(j["mem_bytes"], 55e9);
  EXPECT_EQ(j["ctx"], 4096);
  ASSERT_EQ(j["rows"].size(), 2u);
  EXPECT_EQ(j["rows"][0]["bytes_per_token"], 131072.0);
  EXPECT_EQ(j["rows"][0]["tokens_in_mem_rounded"], 419617);
  EXPECT_EQ(j["rows"][1]["tokens_in_mem_rounded"], 839233);
  EXPECT_EQ(j["rows"][1]["requests"], 204);
  EXPECT_EQ(j["rows"][1]["spec"], "fp8_e4m3:gran=tensor,scale=dynamic");
}

}  // namespace
}  // namespace kvq::planner
