// KIVI quantize + pack throughput on the CPU, per scheme and side, in GB/s (10^9 B/s) of float32
// input of a [4096, 8, 128] tensor (Llama-3.1 8B's kv heads and head dim; 16 MiB), next to a
// memcpy of the same bytes (BM_Copy) in the same run; the table printed at the end gives the
// fraction of memcpy and backend cpu's speedup over ref:
//   BM_Quantize/ref/...  kivi::SideCache with r=0, one append (every token quantized)
//   BM_Quantize/cpu/...  cpu::kivi_quantize (kernels/cpu/kivi.h): the same bytes, bit for bit
//   BM_Append/ref|cpu/... the streaming cache with the spec's window, one append and token by
//                         token, with the reference's group quantizers or backend cpu's
//   build/<preset>/bench/bench_kivi [--backend=ref|cpu|both] [--benchmark_filter=kivi2]
//   [--benchmark_repetitions=3
//       --benchmark_enable_random_interleaving=true]
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_ratio.h"
#include "core/spec.h"
#include "kernels/cpu/kivi.h"
#include "kivi/cache.h"

namespace {

constexpr int64_t kTokens = 4096, kHeads = 8, kDim = 128;
constexpr int64_t kRow = kHeads * kDim;
constexpr int64_t kBytes = kTokens * kRow * static_cast<int64_t>(sizeof(float));

// Gaussian input with two outlier channels per head (fixed seed).
const std::vector<float>& input() {
  static const std::vector<float> x = [] {
    std::vector<float> v(static_cast<size_t>(kTokens * kRow));
    std::mt19937_64 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t i = 0; i < v.size(); ++i) {
      const int64_t d = static_cast<int64_t>(i) % kDim;
      v[i] = normal(rng) * (d == 3 || d == 77 ? 20.0f : 1.0f);
    }
    return v;
  }();
  return x;
}

void set_rate(benchmark::State& state) {
  state.SetBytesProcessed(state.iterations() * kBytes);
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * kBytes / 1e9, benchmark::Counter::kIsRate);
}

void BM_Copy(benchmark::State& state) {
  const std::vector<float>& x = input();
  std::vector<float> dst(x.size(), 1.0f);
  for (auto _ : state) {
    std::memcpy(dst.data(), x.data(), kBytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_rate(state);
}

void BM_Append(benchmark::State& state, const std::string& spec_text, kvq::Role role,
               bool per_token, bool cpu) {
  const kvq::SchemeSpec spec = kvq::parse_spec(spec_text);
  const std::vector<float>& x = input();
  int64_t quantized = 0;
  for (auto _ : state) {
    kvq::kivi::SideCache cache(
        spec.q(), role, kHeads, kDim,
        cpu ? kvq::cpu::kivi_group_quantizers() : kvq::kivi::GroupQuantizers{});
    if (per_token) {
      for (int64_t t = 0; t < kTokens; ++t) cache.append(x.data() + t * kRow, 1);
    } else {
      cache.append(x.data(), kTokens);
    }
    quantized = cache.quantized_tokens();
    benchmark::DoNotOptimize(cache.words().data());
    benchmark::ClobberMemory();
  }
  set_rate(state);
  state.counters["quantized_tokens"] = static_cast<double>(quantized);
}

void BM_Quantize(benchmark::State& state, const std::string& spec_text, kvq::Role role, bool cpu) {
  kvq::SchemeSpec spec = kvq::parse_spec(spec_text);
  spec.q().residual = 0;
  const std::vector<float>& x = input();
  kvq::cpu::KiviPacked out;
  for (auto _ : state) {
    if (cpu) {
      kvq::cpu::kivi_quantize(spec.q(), role, x.data(), kTokens, kHeads, kDim, out);
      benchmark::DoNotOptimize(out.words.data());
    } else {
      kvq::kivi::SideCache cache(spec.q(), role, kHeads, kDim);
      cache.append(x.data(), kTokens);
      benchmark::DoNotOptimize(cache.words().data());
    }
    benchmark::ClobberMemory();
  }
  set_rate(state);
}

void register_all(const std::string& backend) {
  benchmark::RegisterBenchmark("BM_Copy/16MiB", BM_Copy)->Unit(benchmark::kMillisecond);
  for (const char* s : {"kivi2", "kivi4", "int3:k=channel,v=token", "int8:k=channel,v=token"})
    for (kvq::Role role : {kvq::Role::Key, kvq::Role::Value})
      for (bool cpu : {false, true}) {
        if ((cpu && backend == "ref") || (!cpu && backend == "cpu")) continue;
        std::string label = s;
        label = label.substr(0, label.find(':'));
        const std::string name = std::string("BM_Quantize/") + (cpu ? "cpu/" : "ref/") + label +
                                 (role == kvq::Role::Key ? "/key_channel" : "/value_token");
        benchmark::RegisterBenchmark(name.c_str(), BM_Quantize, std::string(s), role, cpu)
            ->Unit(benchmark::kMillisecond);
      }
  const char* specs[][2] = {{"kivi2", "kivi2"},
                            {"kivi4", "kivi4"},
                            {"int3", "int3:k=channel,v=token"},
                            {"int8", "int8:k=channel,v=token"}};
  for (const auto& s : specs)
    for (kvq::Role role : {kvq::Role::Key, kvq::Role::Value})
      for (bool per_token : {false, true})
        for (bool cpu : {false, true}) {
          if ((cpu && backend == "ref") || (!cpu && backend == "cpu")) continue;
          const std::string name = std::string("BM_Append/") + (cpu ? "cpu/" : "ref/") + s[0] +
                                   (role == kvq::Role::Key ? "/key_channel" : "/value_token") +
                                   (per_token ? "/token_by_token" : "/one_append");
          benchmark::RegisterBenchmark(name.c_str(), BM_Append, std::string(s[1]), role, per_token,
                                       cpu)
              ->Unit(benchmark::kMillisecond);
        }
}

}  // namespace

int main(int argc, char** argv) { return kvq::bench::ratio_main(argc, argv, register_all); }
