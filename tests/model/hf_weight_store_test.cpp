// The three weight stores of a checkpoint folder (model/llama.h WeightStore) give the same logits
// bit for bit: kMapped (F32/F16/BF16 matrices multiplied where they lie in the mapped shards),
// kPacked (copied into 16-bit / fp32 panels) and kFp32 (the plain reference product of
// reference_cpu/matmul.h over fp32 weights, an independent implementation of the same chain).
// On every family in tests/fixtures/hf/ (F16, BF16 one file and sharded, F32, FP8 with scales),
// through a prompt fed in chunks that take both kernels (prefill m >= 4, decode m = 1 and 3),
// on attention backends cpu and ref. LlamaModel::load(dir) drops its HfCheckpoint before
// returning, so the mapped model reads through its own share of the mappings.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/io.h"
#include "model/llama.h"
#include "tests/support/expect_error.h"

namespace kvq {
namespace {

std::string fixture_root() {
  if (const char* e = std::getenv("KVQ_HF_FIXTURES"); e && *e) return e;
  return std::string(KVQ_SOURCE_DIR) + "/tests/fixtures/hf";
}

// All positions' logits for the prompt fed as chunks of 5, 3, 1, 1, then the rest.
std::vector<float> chunked_logits(LlamaModel& m, const std::vector<int32_t>& ids,
                                  AttentionBackend b) {
  m.set_backend(b);
  CacheOptions o;
  o.spec = parse_spec("fp32");
  LlamaCache cache(m.config(), o);
  std::vector<float> all, part;
  const size_t sizes[] = {5, 3, 1, 1};
  for (size_t s = 0, i = 0; s < ids.size(); ++i) {
    const size_t len = std::min(i < 4 ? sizes[i] : ids.size(), ids.size() - s);
    m.forward({ids.data() + s, len}, cache, part, true, 2);
    all.insert(all.end(), part.begin(), part.end());
    s += len;
  }
  return all;
}

size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return bad;
}

class HfWeightStores : public ::testing::TestWithParam<const char*> {};

TEST_P(HfWeightStores, MappedPackedAndFp32LogitsBitIdentical) {
  const std::string dir = fixture_root() + "/" + GetParam();
  const auto expected = nlohmann::json::parse(read_file(dir + "/expected.json"));
  const std::vector<int32_t> ids =
      expected[expected["prompt_ids_used"].get<std::string>()].get<std::vector<int32_t>>();
  ASSERT_GE(ids.size(), 12u) << "the chunks need a longer prompt";
  LlamaModel mapped = LlamaModel::load(dir, WeightStore::kMapped),
             packed = LlamaModel::load(dir, WeightStore::kPacked),
             fp32 = LlamaModel::load(dir, WeightStore::kFp32);
  // The stores are what they say: mapped rows where the checkpoint is dense, panels otherwise.
  EXPECT_NE(mapped.weight_formats().find("(mapped rows)"), std::string::npos)
      << mapped.weight_formats();
  EXPECT_EQ(packed.weight_formats().find("mapped"), std::string::npos) << packed.weight_formats();
  EXPECT_LE(mapped.weight_bytes(), packed.weight_bytes());  // panels pad to 64 columns
  for (AttentionBackend b : {AttentionBackend::kCpu, AttentionBackend::kRef}) {
    const std::vector<float> lm = chunked_logits(mapped, ids, b),
                             lp = chunked_logits(packed, ids, b), lf = chunked_logits(fp32, ids, b);
    ASSERT_EQ(lm.size(), ids.size() * static_cast<size_t>(mapped.config().vocab));
    double norm = 0;
    for (float v : lm) norm += static_cast<double>(v) * v;
    EXPECT_GT(norm, 0.0) << "vacuous: all-zero logits";
    EXPECT_EQ(differing(lm, lp), 0u)
        << GetParam() << ": mapped vs packed, backend " << to_string(b);
    EXPECT_EQ(differing(lm, lf), 0u)
        << GetParam() << ": mapped vs fp32 reference store, backend " << to_string(b);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfWeightStores,
                         ::testing::Values("llama", "llama3", "mistral", "qwen2", "qwen3",
                                           "qwen3_fp8", "smollm2"),
                         [](const auto& i) { return std::string(i.param); });

TEST(WeightStoreNames, RoundTripAndOneLineError) {
  for (WeightStore s : {WeightStore::kMapped, WeightStore::kPacked, WeightStore::kFp32})
    EXPECT_EQ(parse_weight_store(weight_store_name(s)), s);
  testing::expect_error([] { (void)parse_weight_store("copy"); },
                        "weights 'copy' is not one of mapped, packed, fp32");
}

}  // namespace
}  // namespace kvq
