// model/packed_matrix: the packed product must equal, bit for bit, the reference chain of
// reference_cpu/matmul.h over the weights gguf::dequantize_row decodes (an independent
// implementation of the same definition: fp32 [in][out] weights, a plain tiled loop). Checked on
// GGUF tensors of every kind the packing handles (its own Q4_1 / Q4_0 / Q8_0 panels, fp32 panels
// for F32, 16-bit panels for F16 / BF16, the file's blocks for K-quants), ragged shapes (out not a
// multiple of the 64-column panel), the decode (m < 4) and prefill (m >= 4) kernels, with and
// without accumulation, and on every matrix of the real model; mapped rows (from_mapped) against
// the same chain and the panels. The kernels run backend cpu's CPU path; ctest runs this program
// under every path this CPU has (KVQ_CPU_PATH, label cpu_path), so every path's forms are checked.
#include "model/packed_matrix.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>

#include "core/half.h"
#include "kernels/cpu/isa.h"
#include "model/llama.h"
#include "reference_cpu/matmul.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/model.h"

namespace kvq {
namespace {

using namespace kvq::testing::gguf_writer;
using gguf::GgufFile;

// The products take the CPU path backend cpu runs (one choice per process, kernels/cpu/isa.h):
// the one KVQ_CPU_PATH names when it is set (ctest's per-path runs), else the widest this CPU has.
TEST(PackedPath, RunsBackendCpuPath) {
  EXPECT_STREQ(PackedMatrix::cpu_path(), cpu::path().name);
  if (const char* forced = std::getenv("KVQ_CPU_PATH"); forced != nullptr && *forced != '\0') {
    EXPECT_STREQ(PackedMatrix::cpu_path(), forced);
  }
}

// Random blocks of `type` whose fp16 scale fields are small finite values (so no NaN appears).
std::string random_blocks(GgmlType type, int64_t blocks, std::mt19937& rng) {
  const gguf::TypeTraits* tr = gguf::type_traits(static_cast<uint32_t>(type));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f), mn(-0.4f, 0.0f), val(-2.0f, 2.0f);
  std::string s;
  for (int64_t b = 0; b < blocks; ++b) {
    std::string blk(static_cast<size_t>(tr->block_bytes), '\0');
    for (char& c : blk) c = static_cast<char>(byte(rng));
    auto put16 = [&](size_t at, uint16_t v) { std::memcpy(blk.data() + at, &v, 2); };
    switch (type) {
      case GgmlType::kQ4_1:
      case GgmlType::kQ4_K:  // d, m (dmin) first
        put16(0, float_to_half_bits(scale(rng)));
        put16(2, float_to_half_bits(type == GgmlType::kQ4_1 ? mn(rng) : scale(rng)));
        break;
      case GgmlType::kQ4_0:
      case GgmlType::kQ8_0:
        put16(0, float_to_half_bits(scale(rng)));
        break;
      case GgmlType::kQ6_K:  // d last
        put16(blk.size() - 2, float_to_half_bits(scale(rng)));
        break;
      case GgmlType::kF16:
        put16(0, float_to_half_bits(val(rng)));
        break;
      case GgmlType::kBF16:
        put16(0, float_to_bf16_bits(val(rng)));
        break;
      case GgmlType::kF32: {
        const float f = val(rng);
        std::memcpy(blk.data(), &f, 4);
        break;
      }
      default:
        break;
    }
    s += blk;
  }
  return s;
}

// y = x W^T by the reference chain (reference_cpu/matmul.h) over the reader's weights.
std::vector<float> reference_product(const GgufFile& f, const gguf::TensorInfo& t,
                                     const std::vector<float>& x, int64_t m,
                                     const std::vector<float>& y0, bool accumulate) {
  const int64_t in = t.dims[0], out = t.dims[1];
  const std::vector<float> w = f.dequantize(t);  // [out][in]
  std::vector<float> wt(static_cast<size_t>(in * out));
  for (int64_t c = 0; c < out; ++c)
    for (int64_t k = 0; k < in; ++k)
      wt[static_cast<size_t>(k * out + c)] = w[static_cast<size_t>(c * in + k)];
  std::vector<float> y = y0;
  matmul(x.data(), m, in, wt.data(), out, y.data(), accumulate);
  return y;
}

void expect_bit_equal(const std::vector<float>& a, const std::vector<float>& b,
                      const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << a.size() << " outputs differ, first at "
                     << first << " (" << a[first] << " vs " << b[first] << ")";
}

void check_tensor(const GgufFile& f, const gguf::TensorInfo& t, std::vector<int64_t> ms,
                  const std::string& name) {
  const PackedMatrix pm = PackedMatrix::from_gguf(f, t);
  const int64_t in = t.dims[0], out = t.dims[1];
  ASSERT_EQ(pm.in(), in);
  ASSERT_EQ(pm.out(), out);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t m : ms)
    for (bool acc : {false, true}) {
      std::vector<float> x(static_cast<size_t>(m * in)), y0(static_cast<size_t>(m * out));
      for (float& v : x) v = nd(rng);
      for (float& v : y0) v = nd(rng);
      std::vector<float> y = y0;
      pm.multiply(x.data(), m, y.data(), acc);
      const auto want = reference_product(f, t, x, m, y0, acc);
      double norm = 0;
      for (float v : y) norm += static_cast<double>(v) * v;
      EXPECT_GT(norm, 0.0) << "vacuous: all-zero output";
      expect_bit_equal(y, want,
                       name + " " + pm.format() + " m=" + std::to_string(m) + (acc ? " +=" : " ="));
    }
  // Rows read one at a time (embedding lookups) equal the reader's rows.
  const std::vector<float> w = f.dequantize(t);
  std::vector<float> row(static_cast<size_t>(in));
  for (int64_t c : {int64_t{0}, out / 2, out - 1}) {
    pm.weight_row(c, row.data());
    expect_bit_equal(row, std::vector<float>(w.begin() + c * in, w.begin() + (c + 1) * in),
                     name + " weight_row " + std::to_string(c));
  }
}

struct Case {
  GgmlType type;
  int64_t out, in;
};

class PackedSynthetic : public ::testing::TestWithParam<Case> {};

TEST_P(PackedSynthetic, EqualsReferenceChainBitForBit) {
  const Case c = GetParam();
  const gguf::TypeTraits* tr = gguf::type_traits(static_cast<uint32_t>(c.type));
  std::mt19937 rng(static_cast<uint32_t>(c.out * 131 + c.in));
  const std::string data = random_blocks(c.type, c.out * c.in / tr->block_elems, rng);
  const auto f = GgufFile::parse(
      one_tensor("w", {static_cast<uint64_t>(c.in), static_cast<uint64_t>(c.out)}, c.type, data),
      "w.gguf");
  check_tensor(f, f.tensor("w"), {1, 2, 3, 4, 5, 9}, tr->name);
}

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  return std::string(gguf::type_traits(static_cast<uint32_t>(i.param.type))->name) + "_out" +
         std::to_string(i.param.out) + "_in" + std::to_string(i.param.in);
}

INSTANTIATE_TEST_SUITE_P(
    Types, PackedSynthetic,
    ::testing::Values(Case{GgmlType::kQ4_1, 64, 32}, Case{GgmlType::kQ4_1, 70, 96},
                      Case{GgmlType::kQ4_1, 200, 320}, Case{GgmlType::kQ4_0, 70, 96},
                      Case{GgmlType::kQ4_0, 128, 288}, Case{GgmlType::kQ8_0, 70, 96},
                      Case{GgmlType::kQ8_0, 192, 320}, Case{GgmlType::kF32, 70, 37},
                      Case{GgmlType::kF16, 65, 300}, Case{GgmlType::kBF16, 64, 64},
                      Case{GgmlType::kQ4_K, 70, 512}, Case{GgmlType::kQ6_K, 66, 256}),
    case_name);

// Mapped rows (PackedMatrix::from_mapped: F32 / F16 / BF16 W [out][in] multiplied where it lies,
// no copy) against the same two independent results: the reference chain of
// reference_cpu/matmul.h over the values gguf::dequantize_row decodes, and the panel copy
// (from_dense); bit for bit, for decode (m < 4, the in-register kernel) and prefill (m >= 4, the
// transposed tile), ragged shapes (out not a multiple of 16 or 64, in not a multiple of the 16-
// or 32-value block, odd in for 16-bit types), with and without accumulation. The values include
// -0, subnormals and, for F16, the largest finite magnitude. The matrix holds the only owner of
// its bytes (the test drops its own), so a dangling view would read freed memory (ASan).
class PackedMapped : public ::testing::TestWithParam<Case> {};

TEST_P(PackedMapped, EqualsReferenceChainAndPanelsBitForBit) {
  const Case c = GetParam();
  const size_t item = c.type == GgmlType::kF32 ? 4 : 2, n = static_cast<size_t>(c.out * c.in);
  std::mt19937 rng(static_cast<uint32_t>(c.out * 977 + c.in));
  std::normal_distribution<float> nd(0.0f, 0.5f);
  auto bytes = std::make_shared<std::vector<uint8_t>>(n * item);
  for (size_t i = 0; i < n; ++i) {
    float v = nd(rng);
    if (i % 97 == 3) v = -0.0f;
    if (i % 101 == 5) v = c.type == GgmlType::kF16 ? 3e-6f : 1e-39f;  // subnormal in the type
    if (i % 211 == 7 && c.type == GgmlType::kF16) v = -65504.0f;
    const uint16_t h = c.type == GgmlType::kF16 ? float_to_half_bits(v) : float_to_bf16_bits(v);
    std::memcpy(bytes->data() + i * item, item == 4 ? static_cast<const void*>(&v) : &h, item);
  }
  std::vector<float> w(n);  // the reader's values, row-major
  gguf::dequantize_row(c.type, bytes->data(), static_cast<int64_t>(n), w.data());
  const PackedMatrix panels = PackedMatrix::from_dense(bytes->data(), c.type, c.out, c.in);
  const uint8_t* at = bytes->data();
  const PackedMatrix pm = PackedMatrix::from_mapped(at, c.type, c.out, c.in, std::move(bytes));
  ASSERT_FALSE(bytes);
  ASSERT_TRUE(pm.mapped());
  ASSERT_FALSE(panels.mapped());
  EXPECT_EQ(pm.bytes(), n * item);
  std::vector<float> wt(n);
  for (int64_t r = 0; r < c.out; ++r)
    for (int64_t k = 0; k < c.in; ++k) wt[static_cast<size_t>(k * c.out + r)] = w[r * c.in + k];
  for (int64_t m : {1, 2, 3, 4, 5, 9})
    for (bool acc : {false, true}) {
      std::vector<float> x(static_cast<size_t>(m * c.in)), y0(static_cast<size_t>(m * c.out));
      for (float& v : x) v = nd(rng);
      for (float& v : y0) v = nd(rng);
      std::vector<float> y = y0, yp = y0, want = y0;
      pm.multiply(x.data(), m, y.data(), acc);
      panels.multiply(x.data(), m, yp.data(), acc);
      matmul(x.data(), m, c.in, wt.data(), c.out, want.data(), acc);
      const std::string what = pm.format() + " m=" + std::to_string(m) + (acc ? " +=" : " =");
      expect_bit_equal(y, want, what + " vs reference chain");
      expect_bit_equal(y, yp, what + " vs panels");
    }
  std::vector<float> row(static_cast<size_t>(c.in));
  for (int64_t r : {int64_t{0}, c.out / 2, c.out - 1}) {
    pm.weight_row(r, row.data());
    expect_bit_equal(row, std::vector<float>(w.begin() + r * c.in, w.begin() + (r + 1) * c.in),
                     "weight_row " + std::to_string(r));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, PackedMapped,
    ::testing::Values(Case{GgmlType::kBF16, 64, 64}, Case{GgmlType::kBF16, 70, 37},
                      Case{GgmlType::kBF16, 200, 576}, Case{GgmlType::kBF16, 9, 31},
                      Case{GgmlType::kF16, 65, 300}, Case{GgmlType::kF16, 130, 33},
                      Case{GgmlType::kF32, 70, 37}, Case{GgmlType::kF32, 128, 100}),
    case_name);

// Every distinct matrix of the real model (Q4_1 layers, the Q8_0 tied embeddings as output head).
TEST(PackedRealModel, EveryMatrixShapeEqualsReferenceChain) {
  KVQ_REQUIRE_MODEL();
  for (const char* name :
       {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
        "blk.0.attn_output.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
        "blk.0.ffn_down.weight", "blk.29.ffn_down.weight", "token_embd.weight"})
    check_tensor(M->file, M->file.tensor(name), {1, 6}, name);
}

// The model with packed weights gives exactly the logits of the fp32-weight reference store
// (dequantized weights multiplied by reference_cpu/matmul.h, the path kvq used before packing),
// for a chunked prefill that exercises both kernels, with an fp32 and a quantized cache.
TEST(PackedRealModel, LogitsEqualFp32WeightStore) {
  KVQ_REQUIRE_MODEL();
  const LlamaModel fp32w = LlamaModel::load(M->file, WeightStore::kFp32);
  const auto ids = M->tok.encode("In the beginning God created the heaven and the earth.");
  ASSERT_GE(ids.size(), 10u);
  for (const char* spec : {"fp32", "kivi2:g=32,r=32"}) {
    CacheOptions o;
    o.spec = parse_spec(spec);
    std::vector<float> a, b, part;
    for (const LlamaModel* m : {&M->model, &fp32w}) {
      LlamaCache cache(m->config(), o);
      auto& all = m == &M->model ? a : b;
      for (size_t s = 0, i = 0; s < ids.size(); ++i) {
        const size_t len = std::min<size_t>(i % 2 ? 1 : 7, ids.size() - s);
        m->forward({ids.data() + s, len}, cache, part, true, 2);
        all.insert(all.end(), part.begin(), part.end());
        s += len;
      }
    }
    expect_bit_equal(a, b, std::string("logits with cache ") + spec);
  }
}

}  // namespace
}  // namespace kvq
