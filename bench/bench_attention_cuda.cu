// Decode attention on the GPU (kernels/cuda/attention_kernels.cu): time, bytes read, effective
// GB/s, fraction of peak bandwidth and speedup over kvq's bf16 cache at the same (shape, context,
// batch, kernel), for each split kernel (DecodeKernel: baseline, tiled, mma; all by default; mma
// runs the tiled kernel on caches its tensor-core kernels do not take: detail::mma_*_supported).
//
// A plain program (no Google Benchmark, so it builds with nvcc alone:
//   nvcc -std=c++20 -O3 -arch=native -I. kernels/cuda/attention_kernels.cu
//   bench/bench_attention_cuda.cu
// ), timing with cudaEvents. Shapes (--shapes): 8 kv heads, head_dim 128, GQA 4 (32 query heads)
// and SmolLM2-135M's 3 kv heads, head_dim 64, GQA 3; one query token per sequence, all sequences
// of the batch at the full context. bench/torch_sdpa_peer.py times PyTorch's SDPA at the same
// shapes the same way (scripts/device-check.sh compares them). Caches hold synthetic codes (finite
// values; the kernels' work does not depend on them). Before every timed run the L2 is flushed by
// writing a buffer of 4x its size, so the cache is read from DRAM; the figure is the median of the
// runs.
//
// Bytes read = the cache's codes + scales (+ minima) + residual window, both sides (what the
// kernel must read; q, partials and outputs are < 1% and not counted). GB/s = 10^9 bytes/s.
// Peak = 2 * memory clock * bus width (cudaDevAttrMemoryClockRate, GlobalMemoryBusWidth), or
// --peak-gbps. Cases that do not fit in free device memory are skipped and listed.
//
// Without a device (none present, or none visible: CUDA_VISIBLE_DEVICES=""): prints one line,
// "bench_attention_cuda: no CUDA device: <the runtime's reason>", on stderr and exits 2
// (kNoDeviceExit; 1 is any other error), so a script never reads an empty run as a measurement.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/cuda_bench.h"
#include "core/error.h"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kivi/layout.h"

namespace kvq::cuda {
namespace {

/// kv heads x head_dim x GQA ratio of a case ("8x128x4" on the command line and in the JSON).
struct BenchShape {
  int kv_heads = 8, head_dim = 128, gqa = 4;
  std::string name() const {
    return std::to_string(kv_heads) + "x" + std::to_string(head_dim) + "x" + std::to_string(gqa);
  }
};
// The shapes the goals read: issue 12's 8 kv heads x d128 x GQA 4, and SmolLM2-135M's 3 x d64 x
// GQA 3 (issue 46).
const BenchShape kMainShape{8, 128, 4};
const BenchShape kSmolLm2Shape{3, 64, 3};
constexpr int kNoDeviceExit = 2;  // exit status without a CUDA device (scripts/device-check.sh)
constexpr int kGroup = 32, kResidual = 128;  // kivi<B>: G = 32, R = 128, K per-channel, V per-token

// ---- options ------------------------------------------------------------------------------------

struct Options {
  std::vector<BenchShape> shapes{kMainShape, kSmolLm2Shape};
  std::vector<int64_t> contexts{1024, 4096, 16384, 32768, 65536, 131072};
  std::vector<int> batches{1, 16, 64};
  std::vector<std::string> kinds{"bf16", "fp8_e4m3_token", "fp8_e4m3_tensor", "kivi4", "kivi2"};
  std::vector<DecodeKernel> kernels{DecodeKernel::Baseline, DecodeKernel::Tiled, DecodeKernel::Mma};
  int reps = 10;
  int warmup = 2;
  int64_t split_tokens = 0;  ///< DecodeShape::split_tokens of every case (0: the plan's choice)
  std::optional<double> peak_gbps;
  std::string json;
};

template <typename T>
std::vector<T> parse_list(const std::string& s, const char* flag) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    if constexpr (std::is_same_v<T, std::string>) {
      out.push_back(item);
    } else {
      char* end = nullptr;
      const long long v = std::strtoll(item.c_str(), &end, 10);
      if (end == item.c_str() || *end != '\0' || v <= 0)
        throw Error(std::string(flag) + ": '" + item + "' is not a positive integer");
      out.push_back(static_cast<T>(v));
    }
  }
  if (out.empty()) throw Error(std::string(flag) + ": empty list");
  return out;
}

void usage() {
  std::printf(
      "bench_attention_cuda [--json PATH] [--peak-gbps X] [--reps N] [--warmup N]\n"
      "                     [--shapes 8x128x4,3x64x3] [--contexts 1024,4096,...]\n"
      "                     [--batches 1,16,64]\n"
      "                     [--kinds bf16,fp8_e4m3_token,fp8_e4m3_tensor,kivi4,kivi2]\n"
      "                     (also fp8_e4m3_channel, kivi3, kivi8; not by default)\n"
      "                     [--kernels baseline,tiled,mma] [--split-tokens N]\n"
      "Decode attention per shape (kv heads x head_dim x GQA; default 8x128x4 and SmolLM2's\n"
      "3x64x3), cache kind and split kernel\n"
      "(kernels/cuda/attention_kernels.cuh, DecodeKernel); bf16 always runs first at each\n"
      "(context, batch, kernel) as the baseline of the speedup column. The goals read the\n"
      "tiled kernel's rows. --split-tokens N fixes every case's split size (DecodeShape::\n"
      "split_tokens; default 0: the plan's choice), to measure how it moves a kernel.\n");
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else if (a == "--json") {
      o.json = value();
    } else if (a == "--peak-gbps") {
      const std::string v = value();
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(x > 0))
        throw Error("--peak-gbps: '" + v + "' is not a positive number");
      o.peak_gbps = x;
    } else if (a == "--reps") {
      o.reps = parse_list<int>(value(), "--reps").front();
    } else if (a == "--warmup") {
      const std::string v = value();
      o.warmup = v == "0" ? 0 : parse_list<int>(v, "--warmup").front();
    } else if (a == "--shapes") {
      o.shapes.clear();
      for (const std::string& x : parse_list<std::string>(value(), "--shapes")) {
        BenchShape sh;
        char tail = 0;
        if (std::sscanf(x.c_str(), "%dx%dx%d%c", &sh.kv_heads, &sh.head_dim, &sh.gqa, &tail) != 3 ||
            sh.kv_heads < 1 || sh.gqa < 1 || sh.gqa > kMaxGqa ||
            (sh.head_dim != 64 && sh.head_dim != 128))
          throw Error("--shapes: '" + x + "' is not KVxDxG with head_dim 64 or 128 and GQA 1.." +
                      std::to_string(kMaxGqa) + " (e.g. 8x128x4)");
        o.shapes.push_back(sh);
      }
    } else if (a == "--contexts") {
      o.contexts = parse_list<int64_t>(value(), "--contexts");
    } else if (a == "--batches") {
      o.batches = parse_list<int>(value(), "--batches");
    } else if (a == "--kinds") {
      o.kinds = parse_list<std::string>(value(), "--kinds");
    } else if (a == "--split-tokens") {
      const std::string v = value();
      o.split_tokens = v == "0" ? 0 : parse_list<int64_t>(v, "--split-tokens").front();
    } else if (a == "--kernels") {
      o.kernels.clear();
      for (const std::string& k : parse_list<std::string>(value(), "--kernels")) {
        if (k == "baseline")
          o.kernels.push_back(DecodeKernel::Baseline);
        else if (k == "tiled")
          o.kernels.push_back(DecodeKernel::Tiled);
        else if (k == "mma")
          o.kernels.push_back(DecodeKernel::Mma);
        else
          throw Error("--kernels: unknown kernel '" + k + "' (baseline, tiled, mma)");
      }
    } else {
      throw Error("unknown argument '" + a + "' (see --help)");
    }
  }
  for (const std::string& k : o.kinds)
    if (k != "bf16" && k != "fp8_e4m3_token" && k != "fp8_e4m3_tensor" && k != "fp8_e4m3_channel" &&
        k != "kivi2" && k != "kivi3" && k != "kivi4" && k != "kivi8")
      throw Error("--kinds: unknown kind '" + k +
                  "' (bf16, fp8_e4m3_token, fp8_e4m3_tensor, fp8_e4m3_channel, kivi2|3|4|8)");
  for (int b : o.batches)
    if (b > kMaxBatch)
      throw Error("--batches: " + std::to_string(b) + " exceeds " + std::to_string(kMaxBatch));
  if (std::find(o.kinds.begin(), o.kinds.end(), "bf16") == o.kinds.end())
    o.kinds.insert(o.kinds.begin(), "bf16");
  std::stable_partition(o.kinds.begin(), o.kinds.end(),
                        [](const std::string& k) { return k == "bf16"; });
  return o;
}

// ---- device memory and synthetic contents -------------------------------------------------------

/// One device allocation, freed on scope exit.
class DeviceMem {
 public:
  explicit DeviceMem(size_t bytes) { KVQ_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(bytes, 16))); }
  ~DeviceMem() { cudaFree(p_); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

__global__ void fill_words(uint32_t* p, size_t n, uint32_t seed, uint32_t and_mask,
                           uint32_t or_mask) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed;  // a cheap integer hash
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    p[i] = (x & and_mask) | or_mask;
  }
}

/// Fills `bytes` (a multiple of 4) at p with hashed words masked to finite patterns.
void fill(void* p, size_t bytes, uint32_t seed, uint32_t and_mask, uint32_t or_mask) {
  const size_t n = bytes / 4;
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 65536));
  fill_words<<<blocks, 256>>>(static_cast<uint32_t*>(p), n, seed, and_mask, or_mask);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

// Word patterns: every value finite and moderate.
constexpr uint32_t kBf16And = 0x807f807fu, kBf16Or = 0x3f003f00u;     // +-[0.5, 1) pairs
constexpr uint32_t kFloatAnd = 0x807fffffu, kFloatOr = 0x3f000000u;   // +-[0.5, 1)
constexpr uint32_t kFp8And = 0xb7b7b7b7u;                             // e4m3 exponents <= 6, no NaN
constexpr uint32_t kHalfScale = 0x2a662a66u, kHalfMin = 0xb800b800u;  // 0.05, -0.5

// ---- one case
// -------------------------------------------------------------------------------------

struct Result {
  BenchShape shape;
  std::string kind;
  std::string kernel;
  int64_t ctx = 0;
  int batch = 0;
  double time_us = 0, bytes = 0, gbps = 0, pct_peak = 0, speedup = 0;
  int64_t split_tokens = 0;
  int splits = 0;
};

struct Skip {
  BenchShape shape;
  std::string kind;
  std::string kernel;
  int64_t ctx;
  int batch;
  std::string reason;
};

struct Env {
  double peak_gbps = 0;
  size_t l2_bytes = 0;
  DeviceMem* flush = nullptr;
  size_t flush_bytes = 0;
  cudaEvent_t start{}, stop{};
};

/// Times fn (one decode-attention call) `reps` times after `warmup` runs, each after an L2 flush.
template <typename Fn>
double median_us(const Env& env, const Options& o, Fn&& fn) {
  std::vector<float> ms;
  for (int r = 0; r < o.warmup + o.reps; ++r) {
    KVQ_CUDA_CHECK(cudaMemsetAsync(env.flush->as<void>(), r & 0xff, env.flush_bytes));
    KVQ_CUDA_CHECK(cudaEventRecord(env.start));
    KVQ_CUDA_CHECK(fn());
    KVQ_CUDA_CHECK(cudaEventRecord(env.stop));
    KVQ_CUDA_CHECK(cudaEventSynchronize(env.stop));
    float t = 0;
    KVQ_CUDA_CHECK(cudaEventElapsedTime(&t, env.start, env.stop));
    if (r >= o.warmup) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  return 1e3 * (n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]));
}

/// Sizes of one sequence's side of a kivi<B> cache (kivi/layout.h), in elements.
struct IntSizes {
  int64_t qt = 0, words = 0, params = 0, resid = 0;
};

IntSizes int_sizes(const BenchShape& sh, int bits, Axis axis, int64_t T) {
  IntSizes s;
  if (axis == Axis::Channel) {
    s.qt = T / kResidual * kResidual;  // B = R: whole blocks of R tokens
    const kivi::ChannelLayout L{sh.kv_heads, sh.head_dim, kGroup, bits};
    s.words = L.words_for_tokens(s.qt);
    s.params = L.params_for_tokens(s.qt);
  } else {
    s.qt = std::max<int64_t>(T - kResidual, 0);  // a sliding window of R
    const kivi::TokenLayout L{sh.kv_heads, sh.head_dim, kGroup, bits};
    s.words = L.words_for_tokens(s.qt);
    s.params = L.params_for_tokens(s.qt);
  }
  s.resid = (T - s.qt) * sh.kv_heads * sh.head_dim;
  return s;
}

double case_bytes(const BenchShape& sh, const std::string& kind, int64_t T, int batch) {
  const double n = static_cast<double>(T) * sh.kv_heads * sh.head_dim;
  double per_seq = 0;
  if (kind == "bf16") {
    per_seq = 2 * n * 2;
  } else if (kind == "fp8_e4m3_token") {
    per_seq = 2 * (n + 4.0 * T * sh.kv_heads);
  } else if (kind == "fp8_e4m3_tensor") {
    per_seq = 2 * (n + 4.0);
  } else if (kind == "fp8_e4m3_channel") {
    per_seq = 2 * (n + 4.0 * sh.kv_heads * sh.head_dim);
  } else {
    const int bits = kind.back() - '0';
    for (Axis a : {Axis::Channel, Axis::Token}) {
      const IntSizes s = int_sizes(sh, bits, a, T);
      per_seq += 4.0 * s.words + 2.0 * 2.0 * s.params + 4.0 * s.resid;  // scales + mins
    }
  }
  return per_seq * batch;
}

/// Allocates and fills one case's cache, runs it; nullopt (with `why`) when it does not fit.
std::optional<Result> run_case(const Env& env, const Options& o, const BenchShape& sh,
                               const std::string& kind, int64_t T, int batch, DecodeKernel kernel,
                               std::string& why) {
  DecodeShape shape{batch, sh.kv_heads, sh.kv_heads * sh.gqa, sh.head_dim};
  shape.split_tokens = o.split_tokens;
  const double bytes = case_bytes(sh, kind, T, batch);
  size_t free_b = 0, total_b = 0;
  KVQ_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const double q_bytes = 4.0 * batch * shape.q_heads * sh.head_dim;
  // Partials: at most one split per 64 tokens (kMinSplit; or per --split-tokens, if fewer) per
  // sequence and query head.
  const int64_t min_split = o.split_tokens > 0 ? std::min<int64_t>(o.split_tokens, 64) : 64;
  const double ws_bound =
      4.0 * batch * shape.q_heads * ((T + min_split - 1) / min_split) * (sh.head_dim + 2);
  const double need = bytes + 2 * q_bytes + ws_bound + (256 << 20);
  if (need > 0.92 * static_cast<double>(free_b)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "needs %.1f GB, %.1f GB free", need / 1e9, free_b / 1e9);
    why = buf;
    return std::nullopt;
  }
  const size_t n =
      static_cast<size_t>(T) * sh.kv_heads * sh.head_dim;  // elements per sequence side
  DeviceMem q(static_cast<size_t>(q_bytes)), out(static_cast<size_t>(q_bytes));
  fill(q.as<void>(), static_cast<size_t>(q_bytes), 7, kFloatAnd, kFloatOr);
  std::vector<DeviceMem*> owned;
  auto alloc = [&](size_t b, uint32_t seed, uint32_t and_mask, uint32_t or_mask) {
    owned.push_back(new DeviceMem(b));
    fill(owned.back()->as<void>(), b, seed, and_mask, or_mask);
    return owned.back();
  };
  struct Cleanup {
    std::vector<DeviceMem*>& v;
    ~Cleanup() {
      for (DeviceMem* m : v) delete m;
    }
  } cleanup{owned};

  Result r;
  r.shape = sh;
  r.kind = kind;
  r.kernel = to_string(kernel);
  r.ctx = T;
  r.batch = batch;
  r.bytes = bytes;
  std::function<cudaError_t()> call;
  DecodePlan plan;
  std::optional<DeviceMem> ws;
  if (kind == "bf16") {
    std::vector<Bf16SideView> k, v;
    for (int side = 0; side < 2; ++side) {
      const DeviceMem* m = alloc(2 * n * batch, 11 + side, kBf16And, kBf16Or);
      for (int b = 0; b < batch; ++b) (side ? v : k).push_back({m->as<uint16_t>() + b * n, T});
    }
    plan = plan_decode(shape, std::span<const Bf16SideView>(k), std::span<const Bf16SideView>(v));
    ws.emplace(plan.workspace_bytes);
    call = [=, &ws, &q, &out] {
      return decode_attention(shape, std::span<const Bf16SideView>(k),
                              std::span<const Bf16SideView>(v), q.as<float>(), out.as<float>(),
                              ws->as<void>(), plan.workspace_bytes, nullptr, kernel);
    };
  } else if (kind.rfind("fp8", 0) == 0) {
    const bool token = kind == "fp8_e4m3_token", channel = kind == "fp8_e4m3_channel";
    const Granularity gran =
        token ? Granularity::Token : (channel ? Granularity::Channel : Granularity::Tensor);
    std::vector<Fp8SideView> k, v;
    const uint32_t scale_bits = 0x3c23d70au;  // 0.01f
    for (int side = 0; side < 2; ++side) {
      const DeviceMem* codes = alloc(n * batch, 21 + side, kFp8And, 0);
      const size_t ns = token     ? static_cast<size_t>(T) * sh.kv_heads
                        : channel ? static_cast<size_t>(sh.kv_heads) * sh.head_dim
                                  : 1;
      const DeviceMem* scales = alloc(4 * ns * batch, 0, 0, scale_bits);
      for (int b = 0; b < batch; ++b)
        (side ? v : k)
            .push_back({codes->as<uint8_t>() + b * n, scales->as<float>() + b * ns, T,
                        Fp8Format::E4M3, gran});
    }
    plan = plan_decode(shape, std::span<const Fp8SideView>(k), std::span<const Fp8SideView>(v));
    ws.emplace(plan.workspace_bytes);
    call = [=, &ws, &q, &out] {
      return decode_attention(shape, std::span<const Fp8SideView>(k),
                              std::span<const Fp8SideView>(v), q.as<float>(), out.as<float>(),
                              ws->as<void>(), plan.workspace_bytes, nullptr, kernel);
    };
  } else {
    const int bits = kind.back() - '0';
    std::vector<IntSideView> k, v;
    for (int side = 0; side < 2; ++side) {
      const Axis axis = side == 0 ? Axis::Channel : Axis::Token;
      const IntSizes s = int_sizes(sh, bits, axis, T);
      const DeviceMem* words = alloc(4 * static_cast<size_t>(s.words) * batch, 31 + side, ~0u, 0);
      const DeviceMem* scales =
          alloc(2 * static_cast<size_t>(s.params) * batch + 4, 0, 0, kHalfScale);
      const DeviceMem* mins = alloc(2 * static_cast<size_t>(s.params) * batch + 4, 0, 0, kHalfMin);
      const DeviceMem* resid =
          alloc(4 * static_cast<size_t>(s.resid) * batch, 41 + side, kFloatAnd, kFloatOr);
      for (int b = 0; b < batch; ++b) {
        IntSideView x;
        x.words = words->as<uint32_t>() + b * s.words;
        x.scales = scales->as<uint16_t>() + b * s.params;
        x.mins = mins->as<uint16_t>() + b * s.params;
        x.residual = resid->as<float>() + b * s.resid;
        x.quantized_tokens = s.qt;
        x.tokens = T;
        x.group = kGroup;
        x.bits = bits;
        x.axis = axis;
        (side ? v : k).push_back(x);
      }
    }
    plan = plan_decode(shape, std::span<const IntSideView>(k), std::span<const IntSideView>(v));
    ws.emplace(plan.workspace_bytes);
    call = [=, &ws, &q, &out] {
      return decode_attention(shape, std::span<const IntSideView>(k),
                              std::span<const IntSideView>(v), q.as<float>(), out.as<float>(),
                              ws->as<void>(), plan.workspace_bytes, nullptr, kernel);
    };
  }
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
  r.split_tokens = plan.split_tokens;
  r.splits = plan.splits;
  r.time_us = median_us(env, o, call);
  r.gbps = bytes / (r.time_us * 1e-6) / 1e9;
  r.pct_peak = 100.0 * r.gbps / env.peak_gbps;
  return r;
}

// ---- output
// ----------------------------------------------------------------------------------------

struct Goal {
  std::string name;
  std::string metric;
  double target = 0;
  std::optional<double> value;
};

const Result* find(const std::vector<Result>& rs, const std::string& kind, int64_t ctx, int batch,
                   const char* kernel) {
  for (const Result& r : rs)
    if (r.shape.name() == kMainShape.name() && r.kind == kind && r.ctx == ctx && r.batch == batch &&
        r.kernel == kernel)
      return &r;
  return nullptr;
}

/// Issue 12's goals, on the tiled kernel's rows at the main shape, against kvq's own bf16 kernel
/// (the names say so). The goals against PyTorch's SDPA (issue 46) need the peer's timings of
/// the same run: scripts/device-check.sh evaluates them (bench/attention_goals.py).
std::vector<Goal> goals(const std::vector<Result>& rs) {
  const char* k = to_string(DecodeKernel::Tiled);
  auto speedup = [&](const char* kind, int batch) -> std::optional<double> {
    const Result* r = find(rs, kind, 32768, batch, k);
    return r ? std::optional<double>(r->speedup) : std::nullopt;
  };
  std::vector<Goal> g;
  for (int batch : {1, 16}) {
    const std::string at =
        " (tiled, " + kMainShape.name() + ", ctx 32k, batch " + std::to_string(batch) + ")";
    g.push_back({"kivi2 >= 3x kvq's bf16" + at, "speedup", 3.0, speedup("kivi2", batch)});
    g.push_back({"kivi4 >= 2x kvq's bf16" + at, "speedup", 2.0, speedup("kivi4", batch)});
    g.push_back({"fp8_e4m3 token scales >= 1.7x kvq's bf16" + at, "speedup", 1.7,
                 speedup("fp8_e4m3_token", batch)});
    g.push_back({"fp8_e4m3 tensor scale >= 1.7x kvq's bf16" + at, "speedup", 1.7,
                 speedup("fp8_e4m3_tensor", batch)});
  }
  const Result* bf = find(rs, "bf16", 32768, 16, k);
  g.push_back(
      {"kvq's bf16 kernel >= 75% of peak (tiled, " + kMainShape.name() + ", ctx 32k, batch 16)",
       "pct_peak", 75.0, bf ? std::optional<double>(bf->pct_peak) : std::nullopt});
  return g;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    o += c;
  }
  return o;
}

void write_json(const std::string& path, const std::string& device, const Env& env, bool peak_flag,
                const Options& o, const std::vector<Result>& rs, const std::vector<Skip>& skips) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw Error("--json: cannot write '" + path + "': " + std::strerror(errno));
  std::fprintf(f, "{\n  \"bench\": \"attention_cuda\",\n  \"device\": \"%s\",\n",
               json_escape(device).c_str());
  std::fprintf(f, "  \"peak_gbps\": %.3f,\n  \"peak_source\": \"%s\",\n", env.peak_gbps,
               peak_flag ? "flag" : "device");
  std::string shapes;
  for (const BenchShape& sh : o.shapes)
    shapes += (shapes.empty() ? "\"" : ", \"") + sh.name() + "\"";
  std::fprintf(f,
               "  \"config\": {\"shapes\": [%s], \"group\": %d, "
               "\"residual\": %d, \"reps\": %d, \"warmup\": %d, \"l2_flush_bytes\": %zu},\n",
               shapes.c_str(), kGroup, kResidual, o.reps, o.warmup, env.flush_bytes);
  std::fprintf(f, "  \"results\": [\n");
  for (size_t i = 0; i < rs.size(); ++i) {
    const Result& r = rs[i];
    std::fprintf(f,
                 "    {\"shape\": \"%s\", \"kv_heads\": %d, \"head_dim\": %d, \"gqa\": %d, "
                 "\"kind\": \"%s\", \"kernel\": \"%s\", \"ctx\": %lld, \"batch\": %d, "
                 "\"time_us\": %.3f, "
                 "\"bytes\": %.0f, \"gbps\": %.3f, \"pct_peak\": %.3f, \"speedup_vs_bf16\": %.4f, "
                 "\"split_tokens\": %lld, \"splits\": %d}%s\n",
                 r.shape.name().c_str(), r.shape.kv_heads, r.shape.head_dim, r.shape.gqa,
                 r.kind.c_str(), r.kernel.c_str(), static_cast<long long>(r.ctx), r.batch,
                 r.time_us, r.bytes, r.gbps, r.pct_peak, r.speedup,
                 static_cast<long long>(r.split_tokens), r.splits, i + 1 < rs.size() ? "," : "");
  }
  std::fprintf(f, "  ],\n  \"skipped\": [\n");
  for (size_t i = 0; i < skips.size(); ++i)
    std::fprintf(f,
                 "    {\"shape\": \"%s\", \"kind\": \"%s\", \"kernel\": \"%s\", \"ctx\": %lld, "
                 "\"batch\": %d, \"reason\": \"%s\"}%s\n",
                 skips[i].shape.name().c_str(), skips[i].kind.c_str(), skips[i].kernel.c_str(),
                 static_cast<long long>(skips[i].ctx), skips[i].batch,
                 json_escape(skips[i].reason).c_str(), i + 1 < skips.size() ? "," : "");
  std::fprintf(f, "  ],\n  \"goals\": [\n");
  const std::vector<Goal> gs = goals(rs);
  for (size_t i = 0; i < gs.size(); ++i) {
    const Goal& g = gs[i];
    if (g.value)
      std::fprintf(f,
                   "    {\"goal\": \"%s\", \"metric\": \"%s\", \"target\": %.3f, \"value\": %.4f, "
                   "\"met\": %s}%s\n",
                   g.name.c_str(), g.metric.c_str(), g.target, *g.value,
                   *g.value >= g.target ? "true" : "false", i + 1 < gs.size() ? "," : "");
    else
      std::fprintf(f,
                   "    {\"goal\": \"%s\", \"metric\": \"%s\", \"target\": %.3f, \"value\": null, "
                   "\"met\": null}%s\n",
                   g.name.c_str(), g.metric.c_str(), g.target, i + 1 < gs.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  if (std::fclose(f) != 0) throw Error("--json: error writing '" + path + "'");
}

int run(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::fprintf(stderr, "bench_attention_cuda: no CUDA device: %s\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount returned 0");
    return kNoDeviceExit;
  }
  int dev = 0;
  KVQ_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  KVQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  int mem_khz = 0, bus_bits = 0, l2 = 0;
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev));
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev));
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  Env env;
  env.peak_gbps = o.peak_gbps ? *o.peak_gbps : 2.0 * mem_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  if (!(env.peak_gbps > 0))
    throw Error("the device reports no memory clock / bus width; pass --peak-gbps");
  env.l2_bytes = static_cast<size_t>(l2);
  env.flush_bytes = std::max<size_t>(4 * env.l2_bytes, 64u << 20);
  DeviceMem flush(env.flush_bytes);
  env.flush = &flush;
  KVQ_CUDA_CHECK(cudaEventCreate(&env.start));
  KVQ_CUDA_CHECK(cudaEventCreate(&env.stop));

  std::printf("# Decode attention (CUDA)\n\n");
  std::printf("Device: %s (sm_%d%d), %zu MB L2, peak %.0f GB/s (%s)\n", prop.name, prop.major,
              prop.minor, env.l2_bytes >> 20, env.peak_gbps,
              o.peak_gbps ? "--peak-gbps" : "memory clock x bus width");
  std::printf("Shapes (kv heads x head_dim x GQA):");
  for (const BenchShape& sh : o.shapes) std::printf(" %s", sh.name().c_str());
  std::printf("; kivi<B>: G=%d, R=%d (K per-channel, V per-token).\n", kGroup, kResidual);
  std::printf("Median of %d runs after %d warm-up, L2 flushed (%zu MB write) before each run.\n\n",
              o.reps, o.warmup, env.flush_bytes >> 20);
  std::printf(
      "| shape | ctx | batch | kernel | kind | time (us) | MB read | GB/s | %% of peak | "
      "speedup vs kvq bf16 | splits |\n");
  std::printf("|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);

  std::vector<Result> results;
  std::vector<Skip> skips;
  for (const BenchShape& sh : o.shapes)
    for (int64_t T : o.contexts)
      for (int batch : o.batches)
        for (DecodeKernel kernel : o.kernels) {
          double bf16_us = 0;
          const char* kn = to_string(kernel);
          const std::string shn = sh.name();
          for (const std::string& kind : o.kinds) {
            std::string why;
            std::optional<Result> r = run_case(env, o, sh, kind, T, batch, kernel, why);
            if (!r) {
              skips.push_back({sh, kind, kn, T, batch, why});
              std::printf("| %s | %lld | %d | %s | %s | skipped: %s | | | | | |\n", shn.c_str(),
                          static_cast<long long>(T), batch, kn, kind.c_str(), why.c_str());
              continue;
            }
            if (kind == "bf16") bf16_us = r->time_us;
            r->speedup = bf16_us > 0 ? bf16_us / r->time_us : 0.0;
            std::printf(
                "| %s | %lld | %d | %s | %s | %.1f | %.1f | %.0f | %.1f | %.2f | %d x %lld |\n",
                shn.c_str(), static_cast<long long>(T), batch, kn, kind.c_str(), r->time_us,
                r->bytes / 1e6, r->gbps, r->pct_peak, r->speedup, r->splits,
                static_cast<long long>(r->split_tokens));
            std::fflush(stdout);
            results.push_back(*r);
          }
        }

  std::printf("\n## Goals\n\n| goal | value | met |\n|---|---:|---|\n");
  for (const Goal& g : goals(results)) {
    if (g.value)
      std::printf("| %s | %.2f%s | %s |\n", g.name.c_str(), *g.value,
                  g.metric == "pct_peak" ? "%" : "x", *g.value >= g.target ? "met" : "missed");
    else
      std::printf("| %s | not measured | - |\n", g.name.c_str());
  }
  if (!o.json.empty())
    write_json(o.json, prop.name, env, o.peak_gbps.has_value(), o, results, skips);
  cudaEventDestroy(env.start);
  cudaEventDestroy(env.stop);
  return 0;
}

}  // namespace
}  // namespace kvq::cuda

int main(int argc, char** argv) {
  return kvq::bench::bench_main("bench_attention_cuda", kvq::cuda::run, argc, argv);
}
