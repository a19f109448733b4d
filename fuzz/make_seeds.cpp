// Writes the small seed corpora of the fuzz targets (fuzz/corpus/<target>/) with kvq's own
// writers and the test GGUF writer, so every seed starts valid and libFuzzer mutates from there.
// Run: build/asan/fuzz/make_seeds fuzz/corpus   (scripts/fuzz.sh does it when a corpus is empty)
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/gguf.h"
#include "core/io.h"
#include "core/npy.h"
#include "core/safetensors.h"
#include "fp8/scale.h"
#include "tests/support/gguf_writer.h"

namespace fs = std::filesystem;
using namespace kvq;
namespace gw = kvq::testing::gguf_writer;

namespace {

void put(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

std::string blocks(gguf::GgmlType t, int64_t n) {  // n values of zero-ish blocks with a scale
  const gguf::TypeTraits* tr = gguf::type_traits(static_cast<uint32_t>(t));
  std::string b(static_cast<size_t>(n / tr->block_elems * tr->block_bytes), '\x11');
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
    return 2;
  }
  const fs::path root = argv[1];
  // npy: float32 and float16, 1-3 dims
  std::vector<float> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i)) * 10;
  put(root / "npy", "f32_2x3x4.npy", encode_npy({2, 3, 4}, v.data()));
  put(root / "npy", "f32_24.npy", encode_npy({24}, v.data()));
  std::string f16 = encode_npy({2, 12}, v.data());
  const auto at = f16.find("<f4");
  if (at != std::string::npos) f16.replace(at, 3, "<f2");
  f16.resize(f16.size() - 24 * 2);  // 24 values of 2 bytes, not 4
  put(root / "npy", "f16_header.npy", f16);
  // safetensors: two float32 tensors with metadata, one F16
  const std::string tmp = (fs::temp_directory_path() / "kvq-seed.safetensors").string();
  write_safetensors(tmp, {{"k", {2, 3, 4}, v}, {"v", {4, 6}, v}}, {{"source", "seed"}});
  put(root / "safetensors", "two_f32.safetensors", read_file(tmp));
  write_safetensors(tmp, {{"h", "F16", {2, 2}, std::string(8, '\x3c')}}, {});
  put(root / "safetensors", "f16.safetensors", read_file(tmp));
  fs::remove(tmp);
  // GGUF: metadata of every value type, and one tensor of each block type kvq decodes
  gw::Builder b;
  b.kv("general.architecture", gw::VT::kString, gw::gstr("llama"))
      .kv("llama.block_count", gw::VT::kUint32, gw::u32(2))
      .kv("llama.embedding_length", gw::VT::kUint32, gw::u32(64))
      .kv("llama.attention.head_count", gw::VT::kUint32, gw::u32(4))
      .kv("llama.attention.head_count_kv", gw::VT::kUint32, gw::u32(2))
      .kv("llama.rope.freq_base", gw::VT::kFloat32, gw::le(10000.0f))
      .kv("general.flag", gw::VT::kBool, std::string(1, '\1'))
      .kv("general.i64", gw::VT::kInt64, gw::le(int64_t{-5}))
      .kv("general.f64", gw::VT::kFloat64, gw::le(0.25))
      .kv("tokenizer.ggml.tokens", gw::VT::kArray,
          gw::garray(gw::VT::kString, 3, gw::gstr("a") + gw::gstr("b") + gw::gstr("ab")));
  for (auto t : {gguf::GgmlType::kF32, gguf::GgmlType::kF16, gguf::GgmlType::kBF16,
                 gguf::GgmlType::kQ8_0, gguf::GgmlType::kQ4_0, gguf::GgmlType::kQ4_1,
                 gguf::GgmlType::kQ4_K, gguf::GgmlType::kQ6_K})
    b.tensor({"t" + std::to_string(static_cast<int>(t)), {256}, static_cast<uint32_t>(t),
              blocks(t, 256), {}});
  put(root / "gguf", "types.gguf", b.build());
  put(root / "gguf", "one_f32.gguf",
      gw::one_tensor("w", {4, 2}, gguf::GgmlType::kF32, std::string(32, '\0')));
  // calibration JSON
  fp8::Calibration c;
  c.model = "seed";
  c.source = "make_seeds";
  c.k_amax = {{1.5f, 2.0f}, {3.0f, 0.5f}};
  c.v_amax = {{1.0f, 1.0f}, {2.0f, 4.0f}};
  const std::string cj = (fs::temp_directory_path() / "kvq-seed-calib.json").string();
  fp8::write_calibration(cj, c);
  put(root / "calibration", "two_layers.json", read_file(cj));
  fs::remove(cj);
  put(root / "calibration", "vllm_scales.json",
      R"({"kvq_calibration": 1, "layers": [{"k_scale": 0.02, "v_scale": [0.01, 0.03]}]})");
  // specs
  int i = 0;
  for (const char* s : {"kivi2", "kivi4:g=64,r=0", "int3:k=channel,v=token,g=32,r=64,sym",
                        "fp8_e4m3:gran=head,scale=dynamic,first=16", "fp8_e5m2:gran=token",
                        "fp8:gran=channel,scale=2.5", "k=kivi2;v=fp8_e4m3:gran=token",
                        "hf:nbits=4,q_group_size=64,residual_length=128", "bf16",
                        "kivi2:arith=fp16", "int8:k=token,v=token,g=dim"})
    put(root / "spec", "s" + std::to_string(i++), s);
  // tokenizer: text, UTF-8, invalid UTF-8, digits, special-token text
  put(root / "tokenizer", "kjv", "In the beginning God created the heaven and the earth.\n");
  put(root / "tokenizer", "utf8", "na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x98\x80 12345");
  put(root / "tokenizer", "invalid", std::string("\xff\xfe\x04\x80 abc \xc3", 11));
  put(root / "tokenizer", "special", "<|im_start|>user\nhi<|im_end|>\n");
  // configs: none written; scripts/fuzz.sh seeds fuzz_config with experiments/configs/ itself
  // roundtrip: scheme byte, heads byte, dim byte, chunk byte, then float32 values
  for (int s = 0; s < 20; s += 3) {
    std::string r = {static_cast<char>(s), 1, 0, 0x5a};
    for (int k = 0; k < 8 * 40; ++k) r += gw::le(std::sin(0.37f * static_cast<float>(k)) * 4.0f);
    put(root / "roundtrip", "scheme" + std::to_string(s), r);
  }
  std::string special = {8, 0, 0, 1};
  for (float f : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, 3e38f, 65504.0f, 1.0f, 1.0f})
    special += gw::le(f);
  put(root / "roundtrip", "specials", special);
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
