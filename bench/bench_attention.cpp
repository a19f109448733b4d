// Decode attention over each cache kind at long context (issue: KIVI + attention).
// One layer, 8 KV heads, head_dim 128, GQA 4 (32 query heads), one query token, contexts
// 1k-32k; bf16 is the baseline. After the runs a table prints each scheme's speedup over bf16
// at the same context and thread count, and its effective bandwidth (stored bytes read / time)
// as a fraction of a plain memcpy's bandwidth measured in the same run.
//
//   build/bench/bench/bench_attention --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>

#include "experiments/synthetic.h"
#include "reference_cpu/attention.h"

namespace {

using namespace kvq;

constexpr int64_t kHeads = 8, kDim = 128, kGqa = 4;
const std::vector<std::string> kSchemes = {"bf16", "fp8_e4m3:gran=token", "fp8_e4m3:gran=tensor",
                                           "kivi4", "kivi2"};
const std::vector<int64_t> kContexts = {1024, 4096, 16384, 32768};

struct Fixture {
  std::unique_ptr<SideStore> k, v;
  std::vector<float> q;
  double bytes = 0;  // stored bytes attention reads (codes, scales, residual)
};

const Tensor3& tensor(int64_t T, bool key) {
  static std::map<std::pair<int64_t, bool>, Tensor3> cache;
  auto& t = cache[{T, key}];
  if (t.data.empty()) t = synthetic_kv({{T, kHeads, kDim}, key ? 2 : 0, key ? 12.0f : 1.0f, key ? 1u : 2u});
  return t;
}

Fixture& fixture(const std::string& scheme, int64_t T) {
  static std::map<std::pair<std::string, int64_t>, Fixture> all;
  Fixture& f = all[{scheme, T}];
  if (!f.k) {
    const SchemeSpec s = parse_spec(scheme);
    f.k = make_side(s, Role::Key, tensor(T, true));
    f.v = make_side(s, Role::Value, tensor(T, false));
    f.bytes = f.k->footprint().total_bytes() + f.v->footprint().total_bytes();
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    f.q.resize(kHeads * kGqa * kDim);
    for (float& x : f.q) x = nd(rng);
  }
  return f;
}

void BM_Decode(benchmark::State& st, const std::string& scheme, int64_t T, int threads) {
  Fixture& f = fixture(scheme, T);
  std::vector<float> out(f.q.size());
  for (auto _ : st) {
    decode_attention(f.q.data(), kHeads * kGqa, *f.k, *f.v, out.data(), threads);
    benchmark::DoNotOptimize(out.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(f.bytes) * st.iterations());
  st.counters["bits_per_elem"] = 8.0 * f.bytes / (2.0 * T * kHeads * kDim);
}

// A plain copy of the bf16 cache's bytes at 32k: the machine's practical bandwidth.
void BM_Copy(benchmark::State& st) {
  const size_t n = static_cast<size_t>(32768 * kHeads * kDim * 2 * 2);
  std::vector<char> a(n, 1), b(n);
  for (auto _ : st) {
    std::memcpy(b.data(), a.data(), n);
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(n) * st.iterations());
}

// Collects every run and prints the ratio table after the console output.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs)
      if (r.run_type == Run::RT_Iteration && !r.error_occurred) {
        const double secs = r.GetAdjustedRealTime();  // in the run's time unit
        times_[r.benchmark_name()] = secs;
        if (r.counters.count("bytes_per_second")) bw_[r.benchmark_name()] = r.counters.at("bytes_per_second");
      }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    const double copy_bw = bw_.count("BM_Copy/real_time") ? bw_["BM_Copy/real_time"] : 0;
    std::printf("\nspeedup over the bf16 cache (same context, same threads), effective GB/s, fraction of memcpy\n");
    std::printf("%-24s %7s %3s %10s %8s %8s %7s\n", "scheme", "context", "thr", "us/query", "speedup", "GB/s", "of_copy");
    for (int threads : {1, 2})
      for (int64_t T : kContexts)
        for (const auto& s : kSchemes) {
          const std::string n = name(s, T, threads), base = name("bf16", T, threads);
          if (!times_.count(n) || !times_.count(base)) continue;
          const double bw = bw_.count(n) ? bw_[n] : 0;
          std::printf("%-24s %7ld %3d %10.1f %7.2fx %8.2f %6.0f%%\n", s.c_str(), static_cast<long>(T), threads,
                      times_[n], times_[base] / times_[n], bw / 1e9, copy_bw > 0 ? 100.0 * bw / copy_bw : 0.0);
        }
    if (copy_bw > 0) std::printf("memcpy bandwidth: %.2f GB/s\n", copy_bw / 1e9);
  }
  static std::string name(const std::string& s, int64_t T, int threads) {
    return "BM_Decode/" + s + "/T" + std::to_string(T) + "/threads:" + std::to_string(threads) + "/real_time";
  }

 private:
  std::map<std::string, double> times_, bw_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RegisterBenchmark("BM_Copy", BM_Copy)->Unit(benchmark::kMicrosecond)->UseRealTime();
  for (int threads : {1, 2})
    for (int64_t T : kContexts)
      for (const auto& s : kSchemes)
        benchmark::RegisterBenchmark(("BM_Decode/" + s + "/T" + std::to_string(T) + "/threads:" + std::to_string(threads)).c_str(),
                                     [s, T, threads](benchmark::State& st) { BM_Decode(st, s, T, threads); })
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
  RatioReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();
  return 0;
}
