// kernels/cuda/device_model.cpp's host code on the CPU: the weights placed as the device holds them
// (q|k|v and gate|up stacked, the biases stacked), the decode step's order (norms, biases, q/k
// norm, RoPE, residuals, the final norm and head) and its copies (a token's one copy is its logits
// back: q|k|v and the attention output stay in "device" memory), run against the host runtime
// stand-in (host_runtime/: device memory is host memory filled with 0xA5, so a buffer never
// written shows) and host stand-ins of the kernels (model_kernels_host.cpp: what each kernel
// computes). The attention between the halves is backend ref's over fp32 host sides reading the
// device model's q|k|v buffer and writing its attention-output buffer in place (what the model's
// device sides and decode call do on a device, kernels/backend.h's append_device /
// attend_decode_device), as the model's own cache would give it.
//
// Expected values: LlamaModel's CPU forward pass over an fp32 cache (tested against transformers,
// tests/model/hf_model_test.cpp), for every token of a prompt. Both sides hold float32 weights
// (the checkpoint's values; bf16 device weights on the BF16 checkpoints, the same values) and
// differ by the order of float32 sums alone: tolerance 1e-4 x max(1, max |logit|), as
// hf_model_test's. A misplaced matrix row, a missed bias or norm, a wrong pairing or residual
// moves logits by 1e-1 or more on these fixtures.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cache/side.h"
#include "core/gguf.h"
#include "core/spec.h"
#include "kernels/backend.h"
#include "kernels/cuda/device_model.h"
#include "model/arch.h"
#include "model/hf_checkpoint.h"
#include "model/llama.h"
#include "model/llama_cuda.h"
#include "tests/support/expect_error.h"
#include "tests/support/model_logits.h"

namespace kvq::cuda {
namespace {

using testing::all_logits;
using testing::hf_fixture;
using testing::prompt_ids;

// Every value of a checkpoint tensor as float, row-major.
std::vector<float> values(const HfCheckpoint& c, const std::string& name) {
  const SafetensorsEntry& e = c.tensor(name);
  int64_t n = 1;
  for (int64_t d : e.shape) n *= d;
  const gguf::GgmlType t = e.dtype == "F32"   ? gguf::GgmlType::kF32
                           : e.dtype == "F16" ? gguf::GgmlType::kF16
                                              : gguf::GgmlType::kBF16;
  EXPECT_TRUE(e.dtype == "F32" || e.dtype == "F16" || e.dtype == "BF16") << name << " " << e.dtype;
  std::vector<float> v(static_cast<size_t>(n));
  gguf::dequantize_row(t, c.data(e), n, v.data());
  return v;
}

// A DeviceModel holding the checkpoint's weights.
std::unique_ptr<DeviceModel> upload(const HfCheckpoint& ck, bool bf16) {
  const LlamaConfig& c = ck.config();
  auto dev = std::make_unique<DeviceModel>(device_model_shape(c), bf16);
  const ArchEntry& a = arch_entry(c.family);
  using M = DeviceModel::Matrix;
  using V = DeviceModel::Vector;
  using R = TensorRole;
  auto mat = [&](M m, R r, int l) {
    const std::vector<float> w = values(ck, tensor_name(a, r, l, true));
    const int64_t cols = dev->matrix_shape(m).second;
    ASSERT_EQ(static_cast<int64_t>(w.size()), dev->matrix_shape(m).first * cols);
    dev->set_matrix(
        m, l, [&](int64_t row, float* out) { std::copy_n(w.data() + row * cols, cols, out); });
  };
  auto vec = [&](V v, R r, int l) {
    const std::vector<float> x = values(ck, tensor_name(a, r, l, true));
    ASSERT_EQ(static_cast<int64_t>(x.size()), dev->vector_size(v));
    dev->set_vector(v, l, x.data());
  };
  for (int l = 0; l < c.layers; ++l) {
    for (const auto& [m, r] : {std::pair{M::kQ, R::kQ},
                               {M::kK, R::kK},
                               {M::kV, R::kV},
                               {M::kO, R::kO},
                               {M::kGate, R::kGate},
                               {M::kUp, R::kUp},
                               {M::kDown, R::kDown}})
      mat(m, r, l);
    vec(V::kAttnNorm, R::kAttnNorm, l);
    vec(V::kFfnNorm, R::kFfnNorm, l);
    if (c.qkv_bias) {
      vec(V::kQBias, R::kQBias, l);
      vec(V::kKBias, R::kKBias, l);
      vec(V::kVBias, R::kVBias, l);
    }
    if (c.o_bias) vec(V::kOBias, R::kOBias, l);
    if (c.qk_norm) {
      vec(V::kQNorm, R::kQNorm, l);
      vec(V::kKNorm, R::kKNorm, l);
    }
  }
  mat(M::kHead, c.tied ? R::kEmbed : R::kOutput, 0);
  if (!c.tied) mat(M::kEmbed, R::kEmbed, 0);
  vec(V::kOutNorm, R::kOutNorm, 0);
  return dev;
}

// Every position's logits of `ids` through the device model's host code, backend ref's attention
// over fp32 host sides between the halves. The step copies nothing to the device and one thing
// back per token (its logits): counted by the runtime stand-in.
std::vector<float> decode_with(DeviceModel& dev, const LlamaConfig& c,
                               const std::vector<int32_t>& ids, const std::string& spec = "fp32") {
  EXPECT_EQ(dev.missing(), "");
  const SchemeSpec sp = parse_spec(spec);
  std::vector<std::unique_ptr<SideStore>> ks, vs;
  for (int l = 0; l < c.layers; ++l) {
    ks.push_back(make_side(sp, Role::Key, c.kv_heads, c.head_dim, l, cpu_side_kernels()));
    vs.push_back(make_side(sp, Role::Value, c.kv_heads, c.head_dim, l, cpu_side_kernels()));
  }
  const int64_t qd = c.q_dim(), kvd = static_cast<int64_t>(c.kv_heads) * c.head_dim;
  std::vector<float> logits(ids.size() * static_cast<size_t>(c.vocab));
  int64_t steps = 0;
  const long long up0 = host_runtime_copies(cudaMemcpyHostToDevice),
                  down0 = host_runtime_copies(cudaMemcpyDeviceToHost);
  dev.decode(
      ids, 0, rope_inv_freq(c),
      [&](int l, int64_t pos, const float* qkv, float* attn) {
        EXPECT_EQ(pos, ks[static_cast<size_t>(l)]->tokens());
        ks[static_cast<size_t>(l)]->append(qkv + qd, 1);
        vs[static_cast<size_t>(l)]->append(qkv + qd + kvd, 1);
        attend_decode(AttentionBackend::kRef, qkv, c.heads, *ks[static_cast<size_t>(l)],
                      *vs[static_cast<size_t>(l)], attn);
        ++steps;
      },
      logits.data(), true);
  EXPECT_EQ(steps, static_cast<int64_t>(ids.size()) * c.layers);
  EXPECT_EQ(host_runtime_copies(cudaMemcpyHostToDevice) - up0, 0) << "copies to the device";
  EXPECT_EQ(host_runtime_copies(cudaMemcpyDeviceToHost) - down0, static_cast<long long>(ids.size()))
      << "copies to the host: one a token (its logits)";
  return logits;
}

std::vector<float> decode(const HfCheckpoint& ck, bool bf16, const std::vector<int32_t>& ids) {
  std::unique_ptr<DeviceModel> dev = upload(ck, bf16);
  return decode_with(*dev, ck.config(), ids);
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double top = 1, err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    top = std::max(top, static_cast<double>(std::fabs(want[i])));
    err = std::max(err, static_cast<double>(std::fabs(got[i] - want[i])));
  }
  EXPECT_LE(err, 1e-4 * top) << what << ": max |device model - cpu| = " << err;
}

class DeviceModelHost : public ::testing::TestWithParam<std::string> {};

// 8 tokens (mistral's window is 8: the CPU's sliding window never applies).
TEST_P(DeviceModelHost, Fp32WeightsMatchTheCpuForwardPass) {
  const HfCheckpoint ck = HfCheckpoint::open(hf_fixture(GetParam()));
  const std::vector<int32_t> ids = prompt_ids(ck.config().vocab, 8);
  expect_close(decode(ck, false, ids), all_logits(LlamaModel::load(hf_fixture(GetParam())), ids),
               GetParam());
}

// bf16 device weights on a BF16 checkpoint: the same values, the same tolerance.
TEST_P(DeviceModelHost, Bf16WeightsOnBf16Checkpoints) {
  const HfCheckpoint ck = HfCheckpoint::open(hf_fixture(GetParam()));
  const ArchEntry& a = arch_entry(ck.config().family);
  if (ck.tensor(tensor_name(a, TensorRole::kQ, 0, true)).dtype != "BF16")
    GTEST_SKIP() << GetParam() << " is not stored as BF16";
  const std::vector<int32_t> ids = prompt_ids(ck.config().vocab, 5, 53, 7);
  expect_close(decode(ck, true, ids), all_logits(LlamaModel::load(hf_fixture(GetParam())), ids),
               GetParam());
}

// The model's own upload (LlamaModel::upload_device_weights: rows through weight_row) from every
// weight store: the checkpoint mapped, packed into panels, and as the fp32 reference store.
TEST_P(DeviceModelHost, ModelUploadFromEveryWeightStore) {
  const std::vector<int32_t> ids = prompt_ids(400, 6, 29, 3);
  const std::vector<float> want = all_logits(LlamaModel::load(hf_fixture(GetParam())), ids);
  for (WeightStore store : {WeightStore::kMapped, WeightStore::kPacked, WeightStore::kFp32}) {
    const LlamaModel m = LlamaModel::load(hf_fixture(GetParam()), store);
    DeviceModel dev(device_model_shape(m.config()), false);
    m.upload_device_weights(dev);
    expect_close(decode_with(dev, m.config(), ids), want,
                 GetParam() + " " + weight_store_name(store));
  }
}

// The device test's tolerance for quantized caches (tests/cuda/model_cuda_test.cpp: 2 D + 1e-4 x
// max |logit|, D the CPU's own fp32-vs-scheme difference) checked where it can be here: the device
// model's step (its sums in another order than the CPU's panels) over the same scheme's host sides,
// so codes may round apart exactly as on a device.
TEST_P(DeviceModelHost, QuantizedCachesWithinTheDeviceTestsTolerance) {
  const HfCheckpoint ck = HfCheckpoint::open(hf_fixture(GetParam()));
  const LlamaModel m = LlamaModel::load(hf_fixture(GetParam()));
  const std::vector<int32_t> ids = prompt_ids(ck.config().vocab, 8);
  const std::vector<float> exact = all_logits(m, ids);
  for (const char* spec : {"bf16", "kivi2:g=8,r=0", "kivi4:g=8,r=0", "fp8_e4m3:gran=token"}) {
    const std::vector<float> cpu = all_logits(m, ids, spec);
    std::unique_ptr<DeviceModel> dev = upload(ck, false);
    const std::vector<float> got = decode_with(*dev, ck.config(), ids, spec);
    const double d = testing::max_diff(exact, cpu), err = testing::max_diff(got, cpu);
    EXPECT_GT(d, 0) << spec << ": the scheme changed nothing (the test would be empty)";
    EXPECT_LE(err, testing::quantized_cache_tolerance(exact, cpu))
        << GetParam() << " " << spec << ": D = " << d;
    std::printf("%s %s: D = %.3g, |device model - cpu| = %.3g\n", GetParam().c_str(), spec, d, err);
  }
}

// A batched step (decode_batch: serve-bench's step on backend cuda) equals each sequence's own
// decode bit for bit: every row takes the same float operations as a single step (model_kernels.h)
// and here the attention is backend ref's per sequence on both sides. Three sequences of 6, 4 and
// 7 tokens starting at steps 0, 1 and 1, so the batches are ragged (1, 3, 3, 3, 3, 2, 1, 1 rows)
// and the rows' positions differ; a sequence leaving (step 5) shifts the rows after it. What it
// catches: a row read at the wrong stride (q|k|v, g|u's down projection input), the q gather,
// a row's own angles or token id, the logits' rows. Copies: one up (ids and angles) and one down
// (logits) a step, and one device-to-device a layer (the q gather).
TEST_P(DeviceModelHost, BatchedStepEqualsEachSequenceAlone) {
  const HfCheckpoint ck = HfCheckpoint::open(hf_fixture(GetParam()));
  const LlamaConfig& c = ck.config();
  struct Seq {
    std::vector<int32_t> ids;
    int64_t start;
  };
  const std::vector<Seq> seqs = {{prompt_ids(c.vocab, 6, 37, 11), 0},
                                 {prompt_ids(c.vocab, 4, 53, 7), 1},
                                 {prompt_ids(c.vocab, 7, 29, 3), 1}};
  for (const bool bf16 : {false, true}) {
    std::unique_ptr<DeviceModel> dev = upload(ck, bf16);
    std::vector<std::vector<float>> alone;
    for (const Seq& q : seqs) alone.push_back(decode_with(*dev, c, q.ids));
    const SchemeSpec fp32 = parse_spec("fp32");
    std::vector<std::vector<std::unique_ptr<SideStore>>> ks(seqs.size()), vs(seqs.size());
    for (size_t b = 0; b < seqs.size(); ++b)
      for (int l = 0; l < c.layers; ++l) {
        ks[b].push_back(make_side(fp32, Role::Key, c.kv_heads, c.head_dim, l, cpu_side_kernels()));
        vs[b].push_back(
            make_side(fp32, Role::Value, c.kv_heads, c.head_dim, l, cpu_side_kernels()));
      }
    const int64_t qd = c.q_dim(), kvd = static_cast<int64_t>(c.kv_heads) * c.head_dim,
                  row = qd + 2 * kvd;
    std::vector<float> logits;
    int64_t compared = 0;
    for (int64_t step = 0; step < 8; ++step) {
      std::vector<size_t> active;
      std::vector<int32_t> tokens;
      std::vector<int64_t> positions;
      for (size_t b = 0; b < seqs.size(); ++b) {
        const int64_t pos = step - seqs[b].start;
        if (pos < 0 || pos >= static_cast<int64_t>(seqs[b].ids.size())) continue;
        active.push_back(b);
        tokens.push_back(seqs[b].ids[static_cast<size_t>(pos)]);
        positions.push_back(pos);
      }
      if (active.empty()) continue;
      const int64_t n = static_cast<int64_t>(active.size());
      logits.assign(static_cast<size_t>(n * c.vocab), 0.0f);
      const long long up0 = host_runtime_copies(cudaMemcpyHostToDevice),
                      down0 = host_runtime_copies(cudaMemcpyDeviceToHost),
                      dd0 = host_runtime_copies(cudaMemcpyDeviceToDevice);
      dev->decode_batch(
          tokens, positions, rope_inv_freq(c),
          [&](int l, const float* qkv, const float* q, float* attn) {
            for (int64_t i = 0; i < n; ++i) {
              const size_t b = active[static_cast<size_t>(i)];
              SideStore& k = *ks[b][static_cast<size_t>(l)];
              SideStore& v = *vs[b][static_cast<size_t>(l)];
              EXPECT_EQ(k.tokens(), positions[static_cast<size_t>(i)]);
              ASSERT_EQ(std::memcmp(q + i * qd, qkv + i * row, static_cast<size_t>(qd) * 4), 0)
                  << "row " << i << "'s q is not its q|k|v row's";
              k.append(qkv + i * row + qd, 1);
              v.append(qkv + i * row + qd + kvd, 1);
              attend_decode(AttentionBackend::kRef, q + i * qd, c.heads, k, v, attn + i * qd);
            }
          },
          logits.data());
      EXPECT_EQ(host_runtime_copies(cudaMemcpyHostToDevice) - up0, 1);
      EXPECT_EQ(host_runtime_copies(cudaMemcpyDeviceToHost) - down0, 1);
      EXPECT_EQ(host_runtime_copies(cudaMemcpyDeviceToDevice) - dd0, c.layers);
      for (int64_t i = 0; i < n; ++i) {
        const size_t b = active[static_cast<size_t>(i)];
        const float* want = alone[b].data() + positions[static_cast<size_t>(i)] * c.vocab;
        EXPECT_EQ(std::memcmp(logits.data() + i * c.vocab, want,
                              static_cast<size_t>(c.vocab) * sizeof(float)),
                  0)
            << GetParam() << (bf16 ? " bf16" : " fp32") << " step " << step << " row " << i
            << " (sequence " << b << ", position " << positions[static_cast<size_t>(i)] << ")";
        ++compared;
      }
    }
    EXPECT_EQ(compared, 6 + 4 + 7);
    EXPECT_GE(dev->batch_capacity(), 3);
  }
}

// Chunked prefill (DeviceModel::prefill: backend cuda's prompt, model/llama_cuda.cpp) equals the
// decode steps token by token: each chunk's rows through the dense part at once, one attention call
// a layer over the chunk (here backend ref's causal call over fp32 host sides, the chunk's K/V
// rows gathered from q|k|v's stride; on a device prefill_device), logits of every row or of the
// last only. Expected: decode_with's logits (token by token, backend ref's decode), bit for bit
// (backend ref's causal call and its decode add in the same order, and a batched row computes what
// a single step does). 8 tokens in chunks of 3 (3, 3, 2: a ragged last chunk), 1 and 8. Copies: one
// up (ids and angles) and one D2D a layer (the q gather) a chunk; down one a chunk (all logits) or
// one in all (the last token's).
TEST_P(DeviceModelHost, ChunkedPrefillEqualsDecodeSteps) {
  const HfCheckpoint ck = HfCheckpoint::open(hf_fixture(GetParam()));
  const LlamaConfig& c = ck.config();
  const std::vector<int32_t> ids = prompt_ids(c.vocab, 8, 41, 5);
  std::unique_ptr<DeviceModel> dev = upload(ck, false);
  const std::vector<float> want = decode_with(*dev, c, ids);
  const int64_t qd = c.q_dim(), kvd = static_cast<int64_t>(c.kv_heads) * c.head_dim,
                row = qd + 2 * kvd, V = c.vocab, n = 8;
  const SchemeSpec fp32 = parse_spec("fp32");
  for (const int64_t chunk : {3, 1, 8}) {
    for (const bool all : {true, false}) {
      const std::string at = fmt::format("{} chunk {} {}", GetParam(), chunk, all ? "all" : "last");
      std::vector<std::unique_ptr<SideStore>> ks, vs;
      for (int l = 0; l < c.layers; ++l) {
        ks.push_back(make_side(fp32, Role::Key, c.kv_heads, c.head_dim, l, cpu_side_kernels()));
        vs.push_back(make_side(fp32, Role::Value, c.kv_heads, c.head_dim, l, cpu_side_kernels()));
      }
      std::vector<float> logits(static_cast<size_t>((all ? n : 1) * V));
      const int64_t chunks = (n + chunk - 1) / chunk;
      int64_t calls = 0;
      const long long up0 = host_runtime_copies(cudaMemcpyHostToDevice),
                      down0 = host_runtime_copies(cudaMemcpyDeviceToHost),
                      dd0 = host_runtime_copies(cudaMemcpyDeviceToDevice);
      dev->prefill(
          ids, 0, rope_inv_freq(c), chunk,
          [&](int l, int64_t pos0, int64_t m, const float* qkv, const float* q, float* attn) {
            SideStore& k = *ks[static_cast<size_t>(l)];
            SideStore& v = *vs[static_cast<size_t>(l)];
            EXPECT_EQ(pos0, k.tokens()) << at;
            EXPECT_EQ(m, std::min(chunk, n - pos0)) << at;
            std::vector<float> kr(static_cast<size_t>(m * kvd)), vr(kr.size()), kt, vt;
            for (int64_t i = 0; i < m; ++i) {
              std::copy_n(qkv + i * row + qd, kvd, kr.data() + i * kvd);
              std::copy_n(qkv + i * row + qd + kvd, kvd, vr.data() + i * kvd);
            }
            const TailSpace ts = tail_space(AttentionBackend::kRef);
            const int64_t kb = gather_exact_tail(k, kr.data(), m, kt, ts);
            const int64_t vb = gather_exact_tail(v, vr.data(), m, vt, ts);
            k.append(kr.data(), m);
            v.append(vr.data(), m);
            attend_causal(AttentionBackend::kRef,
                          CausalArgs{q, m, c.heads, pos0, &k, &v, {kt.data(), kb}, {vt.data(), vb}},
                          attn);
            ++calls;
          },
          logits.data(), all);
      EXPECT_EQ(calls, chunks * c.layers) << at;
      EXPECT_EQ(host_runtime_copies(cudaMemcpyHostToDevice) - up0, chunks) << at;
      EXPECT_EQ(host_runtime_copies(cudaMemcpyDeviceToHost) - down0, all ? chunks : 1) << at;
      EXPECT_EQ(host_runtime_copies(cudaMemcpyDeviceToDevice) - dd0, chunks * c.layers) << at;
      const float* w = want.data() + (all ? 0 : (n - 1) * V);
      EXPECT_EQ(std::memcmp(logits.data(), w, logits.size() * sizeof(float)), 0) << at;
    }
  }
  EXPECT_GE(dev->batch_capacity(), 8);
}

// The chunks a prefill takes: in order, at most `chunk` tokens each, the last one ragged.
TEST(DeviceModelHostBatch, PrefillChunks) {
  using P = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(DeviceModel::prefill_chunks(8, 3), (P{{0, 3}, {3, 3}, {6, 2}}));
  EXPECT_EQ(DeviceModel::prefill_chunks(8, 8), (P{{0, 8}}));
  EXPECT_EQ(DeviceModel::prefill_chunks(5, 256), (P{{0, 5}}));
  EXPECT_EQ(DeviceModel::prefill_chunks(3, 1), (P{{0, 1}, {1, 1}, {2, 1}}));
  EXPECT_EQ(DeviceModel::prefill_chunks(0, 4), P{});
  EXPECT_EQ(DeviceModel::prefill_chunks(1024, 256).size(), 4u);
  testing::expect_error([] { DeviceModel::prefill_chunks(8, 0); },
                        "device model: a prefill of 8 tokens in chunks of 0");
}

INSTANTIATE_TEST_SUITE_P(Families, DeviceModelHost,
                         ::testing::Values("llama", "llama3", "mistral", "qwen2", "qwen3",
                                           "smollm2"),
                         [](const auto& i) { return i.param; });

// The SmolLM2 GGUF (when the model cache holds it): Q4_1 / Q8_0 panels through weight_row,
// adjacent RoPE pairs; 4 tokens against the CPU forward pass. Prints the upload's seconds.
TEST(DeviceModelHostGguf, SmolLM2UploadMatchesTheCpu) {
  const char* dir = std::getenv("KVQ_MODEL_DIR");
  const std::string path =
      (dir && *dir ? std::string(dir)
                   : std::string(std::getenv("HOME") ? std::getenv("HOME") : "") + "/.cache/kvq") +
      "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::is_regular_file(path)) GTEST_SKIP() << path << " is absent";
  const LlamaModel m = LlamaModel::load(path);
  DeviceModel dev(device_model_shape(m.config()), false);
  const auto t0 = std::chrono::steady_clock::now();
  m.upload_device_weights(dev);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("upload of %.0f MB (fp32) from the GGUF's panels: %.2f s\n",
              static_cast<double>(dev.weight_bytes()) / 1e6, s);
  const std::vector<int32_t> ids = {1, 504, 3303, 28};
  expect_close(decode_with(dev, m.config(), ids), all_logits(m, ids), "smollm2 gguf");
}

// The activations a batch takes (DeviceModel::activation_bytes), by hand for SmolLM2-135M (hidden
// 576, 9 heads and 3 kv heads of 64, ffn 1536, vocab 49152): a row holds x and h (2 x 576), q|k|v
// (576 + 2 x 192), q alone and the attention output (2 x 576), g|u (2 x 1536) and the logits
// (49152): 55,488 floats = 221,952 bytes, plus its RopeAngles (1,024 bytes) and token id (4).
TEST(DeviceModelHostBatch, ActivationBytesAndCapacity) {
  DeviceModelShape s;
  s.layers = 30;
  s.hidden = 576;
  s.heads = 9;
  s.kv_heads = 3;
  s.head_dim = 64;
  s.ffn = 1536;
  s.vocab = 49152;
  EXPECT_EQ(DeviceModel::activation_bytes(s, 1), 221952 + 1024 + 4);
  EXPECT_EQ(DeviceModel::activation_bytes(s, 64), 64 * (221952 + 1024 + 4));
  DeviceModel dev(s, true);
  EXPECT_EQ(dev.batch_capacity(), 1);
  dev.reserve_batch(64);
  EXPECT_EQ(dev.batch_capacity(), 64);
  dev.reserve_batch(8);  // grows only
  EXPECT_EQ(dev.batch_capacity(), 64);
  testing::expect_error([&] { dev.reserve_batch(0); }, "device model: batch 0 outside [1, 65535]");
  // a step's arguments are checked before anything runs
  const std::vector<float> inv(32, 0.5f);
  const std::vector<int32_t> ids = {1, 2};
  const std::vector<int64_t> one = {0}, two = {0, 3};
  auto nothing = [](int, const float*, const float*, float*) {};
  std::vector<float> logits(2 * 49152);
  testing::expect_error([&] { dev.decode_batch(ids, one, inv, nothing, logits.data()); },
                        "a batched step of 2 tokens at 1 positions");
  const std::vector<int32_t> bad = {1, 49152};
  testing::expect_error([&] { dev.decode_batch(bad, two, inv, nothing, logits.data()); },
                        "sequence 1's token id 49152 outside the vocabulary");
  testing::expect_error([&] { dev.decode_batch(ids, two, inv, nothing, logits.data()); },
                        "layer 0 q_proj was never uploaded");
}

// What the device model refuses: a weight never uploaded, a tied model's own embeddings.
TEST(DeviceModelHostErrors, MissingWeightsNamed) {
  DeviceModelShape s;
  s.layers = 2;
  s.hidden = 64;
  s.heads = 2;
  s.kv_heads = 1;
  s.head_dim = 32;
  s.ffn = 128;
  s.vocab = 100;
  DeviceModel dev(s, true);
  EXPECT_EQ(dev.missing(), "layer 0 q_proj");
  try {
    dev.embed(3);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0 q_proj was never uploaded"), std::string::npos)
        << e.what();
  }
  try {
    dev.set_matrix(DeviceModel::Matrix::kEmbed, 0, [](int64_t, float*) {});
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tied model"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvq::cuda
