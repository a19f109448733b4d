// Full tier (label full; writes ~2.5 GB, ~1-2 minutes): the memory of loading a 1B-class Hugging
// Face checkpoint folder. A synthetic checkpoint shaped exactly as Llama-3.2-1B (hidden 2048, 16
// layers, 32 heads of 64, 8 kv heads, ffn 8192, vocab 128256, tied embeddings, rope scaling
// llama3; 1,235,814,400 bf16 values = 2.47 GB) is written streaming into two shards with their
// index (values from a fixed-seed splitmix64: random sign and mantissa, magnitudes 2^-8 to 2^-5;
// norms 1.0). A forked child loads it (LlamaModel::load with the default store, WeightStore::
// kMapped, as the CLI does) and runs one forward pass of 8 tokens with an fp32 cache, so first
// use is included. Issue 49's goal, measured two ways:
//  - "under 1.2x their size in peak RSS": the child's peak resident set (wait4's ru_maxrss, the
//    kernel's high-water mark of anonymous plus file-mapped resident pages; the forked child
//    starts with the parent's few MB, counted against it) <= 1.2x the shards' file bytes;
//  - "maps the weights without copying them": the child's anonymous resident memory after the
//    forward pass (RssAnon in /proc/self/status: private memory, where a copy of the weights would
//    have to live; the mapped shards' pages count as RssFile) < 5% of the shards' bytes. The
//    mapped store keeps the weights in the file's pages and multiplies them there, so RssAnon is
//    the activations, the logits (8 x 128256 floats) and the process's own few MB. The panel
//    store (KVQ_HF_1B_STORE=packed runs the child with WeightStore::kPacked) copies every matrix
//    into 16-bit panels and fails this bound (checked: RssAnon 2.48 GB = 100.3%), while it passes
//    the peak-RSS one (its mapped pages are released once copied).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "core/io.h"
#include "core/safetensors.h"
#include "model/llama.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kHidden = 2048, kLayers = 16, kHeads = 32, kKvHeads = 8, kHeadDim = 64,
                  kFfn = 8192, kVocab = 128256;
constexpr double kMaxRssOverFile = 1.2;    // issue 49's goal
constexpr double kMaxAnonOverFile = 0.05;  // "without copying": no room for a copy of the weights

nlohmann::json llama32_1b_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", kHidden},
          {"num_hidden_layers", kLayers},
          {"num_attention_heads", kHeads},
          {"num_key_value_heads", kKvHeads},
          {"head_dim", kHeadDim},
          {"intermediate_size", kFfn},
          {"vocab_size", kVocab},
          {"max_position_embeddings", 131072},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"rope_scaling",
           {{"rope_type", "llama3"},
            {"factor", 32.0},
            {"low_freq_factor", 1.0},
            {"high_freq_factor", 4.0},
            {"original_max_position_embeddings", 8192}}},
          {"tie_word_embeddings", true},
          {"torch_dtype", "bfloat16"}};
}

// The checkpoint's tensors in Llama-3.2-1B's order (embeddings, then layer by layer, final norm).
std::vector<SafetensorsEntry> llama32_1b_tensors() {
  std::vector<SafetensorsEntry> t;
  auto add = [&](const std::string& n, std::vector<int64_t> shape) {
    t.push_back({n, "BF16", std::move(shape), 0, 0});
  };
  add("model.embed_tokens.weight", {kVocab, kHidden});
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {kHidden});
    add(p + "post_attention_layernorm.weight", {kHidden});
    add(p + "self_attn.q_proj.weight", {kHeads * kHeadDim, kHidden});
    add(p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kHidden});
    add(p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kHidden});
    add(p + "self_attn.o_proj.weight", {kHidden, kHeads * kHeadDim});
    add(p + "mlp.gate_proj.weight", {kFfn, kHidden});
    add(p + "mlp.up_proj.weight", {kFfn, kHidden});
    add(p + "mlp.down_proj.weight", {kHidden, kFfn});
  }
  add("model.norm.weight", {kHidden});
  return t;
}

// Tensor `e`'s bf16 values into `out`, 1 MiB at a time: norms 1.0 (0x3F80), matrices from
// splitmix64 (state carried across tensors): sign and 7 mantissa bits random, exponent 2^-8..2^-5.
void write_values(const SafetensorsEntry& e, uint64_t& state, std::ostream& out) {
  int64_t n = 1;
  for (int64_t d : e.shape) n *= d;
  std::vector<uint16_t> buf(1 << 19);
  for (int64_t done = 0; done < n;) {
    const size_t k = static_cast<size_t>(std::min<int64_t>(n - done, std::ssize(buf)));
    for (size_t i = 0; i < k; ++i) {
      if (e.shape.size() == 1) {
        buf[i] = 0x3F80;
        continue;
      }
      uint64_t z = (state += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      const auto sign = static_cast<uint16_t>((z & 1) << 15);
      const auto exp = static_cast<uint16_t>((127 - 8 + ((z >> 1) & 3)) << 7);
      buf[i] = static_cast<uint16_t>(sign | exp | ((z >> 3) & 0x7F));
    }
    out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(k * 2));
    done += static_cast<int64_t>(k);
  }
}

// Writes the folder: config.json, two shards (tensors split at the middle) and their index.
// Returns the shards' file bytes.
uint64_t write_checkpoint(const std::string& dir) {
  write_file_atomic(dir + "/config.json", llama32_1b_config().dump(1));
  const std::vector<SafetensorsEntry> all = llama32_1b_tensors();
  const std::vector<SafetensorsEntry> half[2] = {{all.begin(), all.begin() + std::ssize(all) / 2},
                                                 {all.begin() + std::ssize(all) / 2, all.end()}};
  const std::string names[2] = {"model-00001-of-00002.safetensors",
                                "model-00002-of-00002.safetensors"};
  uint64_t state = 49, bytes = 0;
  nlohmann::json map;
  for (int s = 0; s < 2; ++s) {
    write_safetensors(dir + "/" + names[s], half[s],
                      [&](size_t i, std::ostream& out) { write_values(half[s][i], state, out); });
    for (const SafetensorsEntry& e : half[s]) map[e.name] = names[s];
    bytes += fs::file_size(dir + "/" + names[s]);
  }
  write_file_atomic(
      dir + "/model.safetensors.index.json",
      nlohmann::json{{"metadata", {{"total_size", bytes}}}, {"weight_map", map}}.dump(1));
  return bytes;
}

// A "Key:   N kB" line of /proc/self/status, in bytes (-1 when absent).
double status_bytes(const std::string& key) {
  const std::string s = read_file("/proc/self/status");
  const size_t at = s.find("\n" + key + ":");
  return at == std::string::npos ? -1.0 : std::atof(s.c_str() + at + key.size() + 2) * 1024.0;
}

// The child: load, one forward pass, then RssAnon and RssFile written to `fd`; exit 0 when the
// logits are finite, 1 otherwise, 2 on error.
[[noreturn]] void load_and_forward(const std::string& dir, WeightStore store, int fd) {
  try {
    const LlamaModel m = LlamaModel::load(dir, store);
    CacheOptions o;
    o.spec = parse_spec("fp32");
    LlamaCache c(m.config(), o);
    const std::vector<int32_t> prompt = {128000, 791, 4062, 14198, 39935, 35308, 927, 279};
    std::vector<float> logits;
    m.forward(prompt, c, logits, true, 2);
    bool finite = logits.size() == prompt.size() * static_cast<size_t>(kVocab);
    for (float x : logits) finite = finite && std::isfinite(x);
    const std::string mem =
        std::to_string(status_bytes("RssAnon")) + " " + std::to_string(status_bytes("RssFile"));
    finite = finite && ::write(fd, mem.data(), mem.size()) == static_cast<ssize_t>(mem.size());
    std::fflush(stdout);
    _exit(finite ? 0 : 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
    std::fflush(stderr);
    _exit(2);
  }
}

TEST(HfCheckpointRss, Llama32_1B_Bf16_TwoShards_PeakRssAtMost1_2x_AnonUnder5PercentOfFileBytes) {
  const char* env = std::getenv("KVQ_HF_1B_STORE");
  const WeightStore store = parse_weight_store(env && *env ? env : "mapped");
  const std::string dir =
      (fs::temp_directory_path() / ("kvq_hf_1b_rss_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  struct Cleanup {
    std::string d;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } cleanup{dir};
  const uint64_t file_bytes = write_checkpoint(dir);
  ASSERT_GT(file_bytes, 2'470'000'000u);  // 1,235,814,400 bf16 values plus two headers

  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    load_and_forward(dir, store, fds[1]);
  }
  ::close(fds[1]);
  std::string mem;
  char buf[256];
  for (ssize_t got; (got = ::read(fds[0], buf, sizeof buf)) > 0;) mem.append(buf, buf + got);
  ::close(fds[0]);
  int status = 0;
  rusage ru{};
  ASSERT_EQ(::wait4(pid, &status, 0, &ru), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the child failed to load or gave non-finite logits";
  const double peak = static_cast<double>(ru.ru_maxrss) * 1024.0;  // ru_maxrss is in KiB
  const double ratio = peak / static_cast<double>(file_bytes);
  double anon = -1, file = -1;
  ASSERT_EQ(std::sscanf(mem.c_str(), "%lf %lf", &anon, &file), 2) << "child wrote '" << mem << "'";
  ASSERT_GE(anon, 0.0) << "no RssAnon in /proc/self/status";
  std::printf(
      "weights %.3f GB in two shards, store %s; child peak RSS %.3f GB = %.3fx; after the "
      "forward pass RssAnon %.3f GB = %.1f%%, RssFile %.3f GB\n",
      file_bytes / 1e9, weight_store_name(store), peak / 1e9, ratio, anon / 1e9,
      100.0 * anon / static_cast<double>(file_bytes), file / 1e9);
  EXPECT_LE(ratio, kMaxRssOverFile);
  EXPECT_LT(anon / static_cast<double>(file_bytes), kMaxAnonOverFile)
      << "the weights were copied into private memory";
}

}  // namespace
}  // namespace kvq
