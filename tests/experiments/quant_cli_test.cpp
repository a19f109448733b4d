// `kvq quant` end to end, and every bad input the foundation issue lists: one line on stderr,
// nonzero exit, never a crash.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/half.h"
#include "core/npy.h"
#include "core/safetensors.h"
#include "fp8/format.h"
#include "tests/support/run_cli.h"

namespace kvq {
namespace {

using testing::run_kvq;

class QuantCli : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::temp_dir("quant"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }
  void write(const std::string& n, const std::string& bytes) const {
    std::ofstream(path(n), std::ios::binary) << bytes;
  }
  // Raw npy v1 with an arbitrary header dict.
  static std::string npy(const std::string& dict, const std::string& data) {
    std::string h = dict;
    while ((10 + h.size() + 1) % 64) h.push_back(' ');
    h.push_back('\n');
    std::string out = "\x93NUMPY\x01";
    out += '\0';
    out += static_cast<char>(h.size());
    out += '\0';
    return out + h + data;
  }
  // Expects failure with exactly one stderr line containing `needle`.
  void expect_one_line_error(const std::string& args, const std::string& needle) const {
    const auto r = run_kvq(args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_LT(r.status, 128) << "killed by a signal: " << args;
    EXPECT_EQ(r.err_lines(), 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
  }
  std::filesystem::path dir_;
};

TEST_F(QuantCli, Fp8EveryFormatAndGranularityWritesSameShapeAndStats) {
  std::vector<float> x(5 * 3 * 8);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(i % 17) - 8.0f + (i % 8 == 3 ? 40.0f : 0.0f);
  write_npy(path("k.npy"), {5, 3, 8}, x.data());
  int checked = 0;
  for (const char* fmt : {"fp8_e4m3", "fp8_e4m3fnuz", "fp8_e5m2"})
    for (const char* g : {"tensor", "head", "token", "channel"}) {
      const std::string spec = std::string(fmt) + ":gran=" + g;
      const auto r = run_kvq("quant --scheme " + spec + " --role key " + path("k.npy") + " " +
                             path("o.npy") + " --stats " + path("s.json"));
      ASSERT_EQ(r.status, 0) << spec << ": " << r.err;
      const auto j = nlohmann::json::parse(r.out);
      for (const char* key :
           {"scheme", "effective_bits", "mse", "nmse", "snr_db", "max_abs_err", "cosine"})
        EXPECT_TRUE(j.contains(key)) << key;
      EXPECT_EQ(j["scheme"], spec + ",scale=dynamic");
      EXPECT_EQ(nlohmann::json::parse(testing::slurp(path("s.json"))), j)
          << "--stats equals stdout";
      const auto o = read_npy(path("o.npy"));
      EXPECT_EQ(o.shape, (std::vector<int64_t>{5, 3, 8}));
      // An 8-bit float keeps every value within 1/8 relative of the input (3 mantissa bits or
      // more, scale chosen so nothing saturates); a wrong output would break this.
      EXPECT_GT(j["cosine"].get<double>(), 0.99);
      EXPECT_GT(j["nmse"].get<double>(), 0.0) << "8-bit codes cannot be exact on this input";
      ++checked;
    }
  EXPECT_EQ(checked, 12);
}

TEST_F(QuantCli, Rank2IsOneHeadAndFloat16Accepted) {
  const uint16_t h[6] = {0x3C00, 0x4000, 0x4200, 0xBC00, 0x0000, 0x3800};  // 1 2 3 -1 0 0.5
  std::string data(12, '\0');
  std::memcpy(data.data(), h, 12);
  write("h.npy", npy("{'descr': '<f2', 'fortran_order': False, 'shape': (3, 2), }", data));
  const auto r = run_kvq("quant -s fp32 " + path("h.npy") + " " + path("o.npy"));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto o = read_npy(path("o.npy"));
  EXPECT_EQ(o.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(o.data, (std::vector<float>{1, 2, 3, -1, 0, 0.5f}));
  EXPECT_EQ(nlohmann::json::parse(r.out)["mse"], 0.0);
}

// Issue 14: T <= r quantized nothing and reported "exact" without a word. Expected: one warning
// line on stderr, exit 0, and the report still valid JSON on stdout (residual_tokens = T).
TEST_F(QuantCli, NothingQuantized_warnsOnStderr) {
  std::vector<float> x(4 * 2 * 32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
  write_npy(path("short.npy"), {4, 2, 32}, x.data());
  const std::string out = " " + path("o.npy");
  const auto r = run_kvq("quant -s kivi2:g=32,r=128 --role value " + path("short.npy") + out);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err_lines(), 1) << r.err;
  EXPECT_NE(r.err.find("warning: all 4 tokens stay exact"), std::string::npos) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["residual_tokens"], 4);
  // With r = 0 per-token values quantize every token: no warning.
  const auto q = run_kvq("quant -s kivi2:g=32,r=0 --role value " + path("short.npy") + out);
  ASSERT_EQ(q.status, 0) << q.err;
  EXPECT_EQ(q.err_lines(), 0) << q.err;
}

// Issue 14: numeric flags are checked when the command line is parsed, before any model loads
// (no "loaded ..." banner), with a plain message: CLI11's own range check printed the type's
// maximum, a 300-digit number; --threads -1 and --stride -3 used to run.
TEST_F(QuantCli, NumericFlagsCheckedBeforeWork_plainMessages) {
  const struct {
    std::string args, message;
  } cases[] = {
      {"quant -s fp8_e4m3 --layer -1 a.npy b.npy", "--layer: must be at least 0, got -1"},
      {"model ppl --threads -1", "--threads: must be at least 0, got -1"},
      {"model ppl --stride -3", "--stride: must be at least 0, got -3"},
      {"model ppl --ctx 0", "--ctx: must be at least 2, got 0"},
      {"model ppl --chunk x", "--chunk: must be a whole number, got 'x'"},
      {"model bench --reps 0", "--reps: must be at least 1, got 0"},
      {"model bench --device-chunk 0", "--device-chunk: must be at least 1, got 0"},
      {"model bench --batch 0", "--batch: must be at least 1, got 0"},
      {"compare --outlier-scale 0", "--outlier-scale: must be greater than 0, got 0"},
  };
  for (const auto& c : cases) {
    const auto r = run_kvq(c.args);
    EXPECT_EQ(r.status, 2) << c.args;
    EXPECT_EQ(r.err_lines(), 1) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
    EXPECT_LT(r.err.size(), 120u) << c.args << ": " << r.err;
  }
}

TEST_F(QuantCli, BadInputsGiveOneLineAndNonzeroExit) {
  const std::string f4 = "{'descr': '<f4', 'fortran_order': False, 'shape': ";
  std::string four(16, '\0');
  write("notnpy.npy", "hello, world\n");
  write("i4.npy", npy("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2), }", four));
  write("fortran.npy", npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", four));
  write("rank1.npy", npy(f4 + "(4,), }", four));
  write("rank4.npy", npy(f4 + "(1, 1, 2, 2), }", four));
  write("zero.npy", npy(f4 + "(0, 2, 4), }", ""));
  write("lies.npy", npy(f4 + "(2, 4), }", four));
  float bad[6] = {1, 2, 3, 4, std::nanf(""), 6};
  write_npy(path("nan.npy"), {1, 2, 3}, bad);
  float inf[4] = {1, 2, 3, 1.0f / 0.0f};
  write_npy(path("inf.npy"), {2, 2}, inf);
  const std::string out = " " + path("o.npy");
  expect_one_line_error("quant -s fp8_e4m3 " + path("missing.npy") + out,
                        "missing.npy: no such file");
  expect_one_line_error("quant -s fp8_e4m3 " + dir_.string() + out, "is a directory");
  expect_one_line_error("quant -s fp8_e4m3 " + path("notnpy.npy") + out, "not an .npy file");
  expect_one_line_error("quant -s fp8_e4m3 " + path("i4.npy") + out, "unsupported dtype '<i4'");
  expect_one_line_error("quant -s fp8_e4m3 " + path("fortran.npy") + out, "Fortran");
  expect_one_line_error("quant -s fp8_e4m3 " + path("rank1.npy") + out, "rank 1");
  expect_one_line_error("quant -s fp8_e4m3 " + path("rank4.npy") + out, "rank 4");
  expect_one_line_error("quant -s fp8_e4m3 " + path("zero.npy") + out, "zero-sized");
  expect_one_line_error("quant -s fp8_e4m3 " + path("lies.npy") + out,
                        "needs 32 data bytes but the file has 16");
  expect_one_line_error("quant -s fp8_e4m3 " + path("nan.npy") + out,
                        "at token 0, head 1, channel 1");
  expect_one_line_error("quant -s fp8_e4m3 " + path("inf.npy") + out,
                        "at token 1, head 0, channel 1");
  write_npy(path("ok.npy"), {1, 2, 3}, bad);  // contents irrelevant: spec errors come first
  expect_one_line_error("quant -s fp8_e4m3:gran=row " + path("ok.npy") + out, "gran=row");
  expect_one_line_error("quant -s nf4 " + path("ok.npy") + out, "unknown scheme 'nf4'");
  expect_one_line_error("quant -s fp8_e4m3 --role query " + path("ok.npy") + out, "--role");
  expect_one_line_error("quant " + path("ok.npy") + out, "--kv is required");
  expect_one_line_error("quant -s kivi2:sink=4 --codes " + path("c.safetensors") + " " +
                            path("ok.npy") + out,
                        "--codes writes one scheme's stored bytes");
  EXPECT_FALSE(std::filesystem::exists(path("o.npy"))) << "no output written on error";
}

TEST_F(QuantCli, UnwritableOutputIsAnError) {
  float x[2] = {1, 2};
  write_npy(path("x.npy"), {1, 2}, x);
  expect_one_line_error("quant -s bf16 " + path("x.npy") + " /nonexistent_dir/o.npy",
                        "cannot open for writing");
}

// Issue 14: numpy's default float64 and big-endian npy are converted with a note, and a
// safetensors tensor (what `kvq model dump` writes) is read by name; each gives the same output
// bytes and the same report as the float32 npy of the same values (the values here are exact in
// float32, so the conversions lose nothing).
TEST_F(QuantCli, Float64BigEndianAndSafetensorsInputs_sameResultAsFloat32Npy) {
  const int64_t T = 40, H = 2, D = 16;
  std::vector<float> x(static_cast<size_t>(T * H * D));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(static_cast<int>(i * 7919 % 61) - 30) / 8.0f +
           (i % D == 5 ? 9.0f : 0.0f);
  write_npy(path("f4.npy"), {T, H, D}, x.data());
  std::string le8, be4;
  for (float v : x) {
    const double d = v;
    le8.append(reinterpret_cast<const char*>(&d), 8);
    const char* b = reinterpret_cast<const char*>(&v);
    be4 += std::string{b[3], b[2], b[1], b[0]};
  }
  write("f8.npy", npy("{'descr': '<f8', 'fortran_order': False, 'shape': (40, 2, 16), }", le8));
  write("be.npy", npy("{'descr': '>f4', 'fortran_order': False, 'shape': (40, 2, 16), }", be4));
  write_safetensors(path("kv.safetensors"),
                    {{"layer.0.k", {T, H, D}, x}, {"layer.0.v", {T, H, D}, x}});
  write_safetensors(path("one.safetensors"), {{"k", {T, H, D}, x}});
  const std::string q = "quant --scheme kivi2:g=16,r=16 --role key ";
  const auto ref = run_kvq(q + path("f4.npy") + " " + path("o_ref.npy"));
  ASSERT_EQ(ref.status, 0) << ref.err;
  EXPECT_TRUE(ref.err.empty()) << ref.err;
  const std::string want = testing::slurp(dir_ / "o_ref.npy");
  for (const auto& [in, note] : std::vector<std::pair<std::string, std::string>>{
           {path("f8.npy"), "dtype '<f8' (float64) read as float32, each value rounded"},
           {path("be.npy"), "dtype '>f4' (big-endian float32) read as float32 (exact)"},
           {path("kv.safetensors") + ":layer.0.k", ""},
           {path("one.safetensors"), ""}}) {
    const auto r = run_kvq(q + in + " " + path("o.npy"));
    ASSERT_EQ(r.status, 0) << in << ": " << r.err;
    EXPECT_EQ(r.out, ref.out) << in;
    EXPECT_EQ(testing::slurp(dir_ / "o.npy"), want) << in;
    if (note.empty()) {
      EXPECT_TRUE(r.err.empty()) << in << ": " << r.err;
    } else {
      EXPECT_NE(r.err.find(note), std::string::npos) << in << ": " << r.err;
    }
  }
  expect_one_line_error(q + path("kv.safetensors") + " " + path("o.npy"),
                        "holds 2 tensors; name one as");
  expect_one_line_error(q + path("kv.safetensors") + ":layer.9.k " + path("o.npy"),
                        "no tensor 'layer.9.k' (tensors: layer.0.k, layer.0.v)");
}

// Issue 14: one name per concept. --kv names the scheme in quant and compare as in the model
// commands and the planner; --scheme/-s and --schemes stay as hidden aliases (same output).
TEST_F(QuantCli, KvIsTheSchemeFlagEverywhere_oldNamesHiddenAliases) {
  std::vector<float> x(6 * 2 * 8);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) - 6.0f;
  write_npy(path("k.npy"), {6, 2, 8}, x.data());
  const auto a =
      run_kvq("quant --kv fp8_e4m3:gran=head --role key " + path("k.npy") + " " + path("a.npy"));
  const auto b =
      run_kvq("quant -s fp8_e4m3:gran=head --role key " + path("k.npy") + " " + path("b.npy"));
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(testing::slurp(dir_ / "a.npy"), testing::slurp(dir_ / "b.npy"));
  const auto c = run_kvq("compare --role key " + path("k.npy") + " --kv bf16 kivi2:g=8,r=0");
  const auto d = run_kvq("compare --role key " + path("k.npy") + " --schemes bf16 kivi2:g=8,r=0");
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_EQ(c.out, d.out);
  EXPECT_NE(c.out.find("kivi2:g=8,r=0"), std::string::npos) << c.out;
  const auto h = run_kvq("quant --help");
  EXPECT_NE(h.out.find("--kv"), std::string::npos) << h.out;
  EXPECT_EQ(h.out.find("--scheme"), std::string::npos) << "the old name is hidden: " << h.out;
}

// Issue 14: `kvq quant --codes` writes what the cache stores. The test decodes the file with the
// layout its metadata states (written out here, not kvq's readers) and must get back the values
// `kvq quant` writes as its output, for a per-channel side, a per-token side and FP8.
TEST_F(QuantCli, CodesFile_decodedByItsStatedLayout_givesTheOutputValues) {
  const int64_t T = 40, H = 2, D = 16;
  std::vector<float> x(static_cast<size_t>(T * H * D));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(static_cast<int>(i * 7919 % 53) - 26) / 7.0f;
  write_npy(path("k.npy"), {T, H, D}, x.data());
  struct Tensor {
    std::string dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  auto load = [&](const std::string& f, nlohmann::json& meta) {
    const std::string b = testing::slurp(dir_ / f);
    uint64_t n = 0;
    std::memcpy(&n, b.data(), 8);
    const auto h = nlohmann::json::parse(b.substr(8, n));
    std::map<std::string, Tensor> out;
    for (const auto& [k, v] : h.items()) {
      if (k == "__metadata__") {
        meta = v;
        continue;
      }
      const uint64_t a = v["data_offsets"][0], e = v["data_offsets"][1];
      out[k] = {v["dtype"], v["shape"].get<std::vector<int64_t>>(), b.substr(8 + n + a, e - a)};
    }
    return out;
  };
  auto u32 = [](const std::string& b, int64_t i) {
    uint32_t v;
    std::memcpy(&v, b.data() + 4 * i, 4);
    return v;
  };
  auto f16 = [](const std::string& b, int64_t i) {
    uint16_t v;
    std::memcpy(&v, b.data() + 2 * i, 2);
    return half_bits_to_float(v);
  };
  for (const char* spec :
       {"kivi2:g=16,r=16", "int4:k=token,v=token,g=8,r=8", "fp8_e4m3:gran=token"}) {
    SCOPED_TRACE(spec);
    const auto r = run_kvq(std::string("quant --kv ") + spec + " --role key " + path("k.npy") +
                           " " + path("o.npy") + " --codes " + path("c.safetensors"));
    ASSERT_EQ(r.status, 0) << r.err;
    const NpyArray want = read_npy(path("o.npy"));
    nlohmann::json meta;
    auto ts = load("c.safetensors", meta);
    const int64_t qt = std::stoll(meta["quantized_tokens"].get<std::string>());
    ASSERT_GT(qt, 0);
    std::vector<float> got(x.size(), NAN);
    if (std::string(spec).starts_with("fp8")) {
      EXPECT_EQ(ts["codes"].dtype, "U8");
      for (int64_t t = 0; t < qt; ++t)
        for (int64_t h = 0; h < H; ++h) {
          float sc;
          std::memcpy(&sc, ts["scales"].bytes.data() + 4 * (t * H + h), 4);  // one per (t, h)
          for (int64_t d = 0; d < D; ++d) {
            const auto c =
                static_cast<uint8_t>(ts["codes"].bytes[static_cast<size_t>((t * H + h) * D + d)]);
            got[static_cast<size_t>((t * H + h) * D + d)] = sc * fp8::decode(Fp8Format::E4M3, c);
          }
        }
    } else {
      const int B = std::stoi(meta["bits"].get<std::string>()),
                G = std::stoi(meta["group"].get<std::string>());
      const int P = 32 / B;
      const bool channel = meta["axis"] == "channel";
      const int64_t wpg = (G + P - 1) / P, groups = (D + G - 1) / G;
      for (int64_t t = 0; t < qt; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d) {
            const int64_t p = channel ? ((t / G) * H + h) * D + d : (t * H + h) * groups + d / G;
            const int64_t w0 = channel ? p * wpg : (t * H + h) * groups * wpg + (d / G) * wpg;
            const int64_t i = channel ? t % G : d % G;
            const uint32_t code =
                (u32(ts["words"].bytes, w0 + i / P) >> (B * (i % P))) & ((1u << B) - 1);
            got[static_cast<size_t>((t * H + h) * D + d)] =
                f16(ts["mins"].bytes, p) + f16(ts["scales"].bytes, p) * static_cast<float>(code);
          }
    }
    if (qt < T) {  // the tokens still exact follow
      ASSERT_EQ(ts["exact_tail"].shape, (std::vector<int64_t>{T - qt, H, D}));
      std::memcpy(got.data() + qt * H * D, ts["exact_tail"].bytes.data(),
                  ts["exact_tail"].bytes.size());
    } else {
      EXPECT_EQ(ts.count("exact_tail"), 0u);
    }
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want.data[i], 1e-6f * (1 + std::fabs(want.data[i]))) << "element " << i;
  }
}

}  // namespace
}  // namespace kvq
