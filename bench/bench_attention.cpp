// Decode attention over each cache kind at long context, backend ref (reference_cpu/) beside
// backend cpu (kernels/cpu/) in one run. One layer, 8 KV heads, head_dim 128, GQA 4 (32 query
// heads), one query token, contexts 1k-32k; both backends read the same stored bytes. After the
// runs a table prints, per backend, each scheme's time, its speedup over the same backend's bf16
// at the same context and thread count, cpu's speedup over ref, and the effective bandwidth
// (stored bytes read / time) as a fraction of a plain memcpy and of a read stream measured in the
// same run, and the multiply-adds per second as a fraction of one core's measured peak (fp32 FMA
// lanes; byte products for the int8 mode's kivi cases, bf16 products for its fp8 cases) times the
// threads.
//
// One-thread cases are timed in process CPU time (robust on a shared machine), two-thread cases
// in real time. Interleave repetitions and take medians:
//   build/bench/bench_attention --benchmark_repetitions=3
//   --benchmark_enable_random_interleaving=true
// Flags of this program (before the benchmark ones): --backend=ref|cpu|both (default both),
// --int-mode=exact|int8|both (backend cpu's kivi and fp8 codes; default both),
// --contexts=1024,4096,...,
// --shape=H,D,GQA (default 8,128,4; SmolLM2-135M's is 3,64,3),
// --l3-bytes=N (the L3 size backend cpu assumes when it picks streamed or cache-resident reads,
// cpu::set_l3_bytes: 0 streams every call; default -1, the size the system reports)
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "bench/bench_ratio.h"
#include "core/error.h"
#include "core/io.h"
#include "evaluation/synthetic.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/isa.h"
#include "reference_cpu/attention.h"

namespace {

using namespace kvq;

int64_t kHeads = 8, kDim = 128, kGqa = 4;  // --shape=H,D,GQA
std::vector<std::string> kSchemes = {"bf16", "fp8_e4m3:gran=token", "fp8_e4m3:gran=tensor", "kivi4",
                                     "kivi2"};  // --kv=SPEC|SPEC|...
std::vector<int64_t> g_contexts = {1024, 4096, 16384, 32768};

struct Fixture {
  std::unique_ptr<SideStore> k, v;
  std::vector<float> q;
  double bytes = 0;  // stored bytes attention reads (codes, scales, residual)
};

const Tensor3& tensor(int64_t T, bool key) {
  static std::map<std::pair<int64_t, bool>, Tensor3> cache;
  auto& t = cache[{T, key}];
  if (t.data.empty())
    t = synthetic_kv({{T, kHeads, kDim}, key ? 2 : 0, key ? 12.0f : 1.0f, key ? 1u : 2u});
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

// backend: "ref", "cpu" (the exact mode) or "cpu-int8" (the int8 mode: kivi and fp8 codes).
void BM_Decode(benchmark::State& st, const std::string& backend, const std::string& scheme,
               int64_t T, int threads) {
  Fixture& f = fixture(scheme, T);
  std::vector<float> out(f.q.size());
  const AttentionBackend b = parse_backend(backend);  // kernels/backend.h
  for (auto _ : st) {
    // a rot= spec (--kv) times the query's rotation and the output's with the call
    attend_decode(b, f.q.data(), kHeads * kGqa, *f.k, *f.v, out.data(), threads);
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

// The machine's limits, measured in the same run (the fractions the table prints):
// BM_ReadStream/threads:N reads the bf16 cache's bytes at 32k once with vector loads on N
// threads; BM_FmaPeak, BM_DpbusdPeak and BM_Bf16DotPeak run 12 independent chains of vfmadd231ps
// (fp32 lanes), vpdpbusd (4 byte products per 32-bit lane) or vdpbf16ps (2 bf16 products per
// lane), 512-bit where the kernels are, on one core; BM_AmxPeak 4 chains of tdpbf16ps where
// cpu::amx().
void BM_ReadStream(benchmark::State& st, int threads) {
  const size_t n = static_cast<size_t>(32768 * kHeads * kDim * 2 * 2) / 64 * 64;
  static std::vector<uint64_t> buf;
  if (buf.size() != n / 8) buf.assign(n / 8, 1);
  const uint64_t* b = buf.data();
  for (auto _ : st) {
    uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const int64_t parts = omp_get_num_threads(), me = omp_get_thread_num();
      const int64_t lines = static_cast<int64_t>(n / 64), a = lines * me / parts,
                    e = lines * (me + 1) / parts;
#if KVQ_CPU_AVX2
      __m256i x0 = _mm256_setzero_si256(), x1 = x0;
      for (int64_t l = a; l < e; ++l) {
        const auto* p = reinterpret_cast<const __m256i*>(b + l * 8);
        x0 = _mm256_add_epi64(x0, _mm256_loadu_si256(p));
        x1 = _mm256_add_epi64(x1, _mm256_loadu_si256(p + 1));
      }
      alignas(32) uint64_t r[4];
      _mm256_store_si256(reinterpret_cast<__m256i*>(r), _mm256_add_epi64(x0, x1));
      total += r[0] + r[1] + r[2] + r[3];
#else
      for (int64_t l = a * 8; l < e * 8; ++l) total += b[l];
#endif
    }
    benchmark::DoNotOptimize(total);
  }
  st.SetBytesProcessed(static_cast<int64_t>(n) * st.iterations());
}

#if KVQ_CPU_AVX2
// One asm block that zeroes registers 0-11 (accumulators) and 14-15 (sources: zeros, so no
// denormal or NaN slows a unit), then runs `n` steps of 12 independent `op`s, one per
// accumulator.
#if KVQ_CPU_AVX512
#define KVQ_PEAK_R(i) "%%zmm" #i
#define KVQ_PEAK_ZERO(i) "vpxord " KVQ_PEAK_R(i) "," KVQ_PEAK_R(i) "," KVQ_PEAK_R(i) "\n\t"
constexpr int kPeakLanes = 16;
#else
#define KVQ_PEAK_R(i) "%%ymm" #i
#define KVQ_PEAK_ZERO(i) "vpxor " KVQ_PEAK_R(i) "," KVQ_PEAK_R(i) "," KVQ_PEAK_R(i) "\n\t"
constexpr int kPeakLanes = 8;
#endif
#define KVQ_PEAK_OP(op, i) op " " KVQ_PEAK_R(14) "," KVQ_PEAK_R(15) "," KVQ_PEAK_R(i) "\n\t"
#define KVQ_PEAK_LOOP(op)                                                                      \
  KVQ_PEAK_ZERO(0)                                                                             \
  KVQ_PEAK_ZERO(1)                                                                             \
  KVQ_PEAK_ZERO(2)                                                                             \
  KVQ_PEAK_ZERO(3)                                                                             \
  KVQ_PEAK_ZERO(4) KVQ_PEAK_ZERO(5) KVQ_PEAK_ZERO(6) KVQ_PEAK_ZERO(7) KVQ_PEAK_ZERO(8)         \
      KVQ_PEAK_ZERO(9) KVQ_PEAK_ZERO(10) KVQ_PEAK_ZERO(11) KVQ_PEAK_ZERO(14)                   \
          KVQ_PEAK_ZERO(15) "1:\n\t" KVQ_PEAK_OP(op, 0) KVQ_PEAK_OP(op, 1) KVQ_PEAK_OP(op, 2)  \
              KVQ_PEAK_OP(op, 3) KVQ_PEAK_OP(op, 4) KVQ_PEAK_OP(op, 5) KVQ_PEAK_OP(op, 6)      \
                  KVQ_PEAK_OP(op, 7) KVQ_PEAK_OP(op, 8) KVQ_PEAK_OP(op, 9) KVQ_PEAK_OP(op, 10) \
                      KVQ_PEAK_OP(op, 11) "dec %[n]\n\tjnz 1b\n\t"
#define KVQ_PEAK_CLOBBERS                                                                  \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
      "xmm11", "xmm14", "xmm15", "cc"
constexpr int64_t kPeakSteps = 1 << 20;  // 12 instructions each
void BM_FmaPeak(benchmark::State& st) {
  for (auto _ : st) {
    int64_t n = kPeakSteps;
    asm volatile(KVQ_PEAK_LOOP("vfmadd231ps") : [n] "+r"(n) : : KVQ_PEAK_CLOBBERS);
  }
  st.counters["lane_fma"] = benchmark::Counter(12.0 * kPeakLanes * kPeakSteps * st.iterations(),
                                               benchmark::Counter::kIsRate);
}
#if KVQ_CPU_VNNI
void BM_DpbusdPeak(benchmark::State& st) {
#if KVQ_CPU_AVX512 && defined(__AVX512VNNI__)
  for (auto _ : st) {
    int64_t n = kPeakSteps;
    asm volatile(KVQ_PEAK_LOOP("vpdpbusd") : [n] "+r"(n) : : KVQ_PEAK_CLOBBERS);
  }
  constexpr double kProducts = 4.0 * kPeakLanes;  // 4 byte products per 32-bit lane
#else
  // AVX-VNNI without AVX-512: the 256-bit VEX form (the registers above are ymm then)
  for (auto _ : st) {
    int64_t n = kPeakSteps;
    asm volatile(KVQ_PEAK_LOOP("%{vex%} vpdpbusd") : [n] "+r"(n) : : KVQ_PEAK_CLOBBERS);
  }
  constexpr double kProducts = 32.0;
#endif
  st.counters["products"] = benchmark::Counter(12.0 * kProducts * kPeakSteps * st.iterations(),
                                               benchmark::Counter::kIsRate);
}
#endif
#endif

#if KVQ_CPU_BF16DOT
// vdpbf16ps: 2 bf16 products per 32-bit lane (the int8 mode's fp8 kernels).
void BM_Bf16DotPeak(benchmark::State& st) {
  for (auto _ : st) {
    int64_t n = kPeakSteps;
    asm volatile(KVQ_PEAK_LOOP("vdpbf16ps") : [n] "+r"(n) : : KVQ_PEAK_CLOBBERS);
  }
  st.counters["bf16_products"] = benchmark::Counter(
      12.0 * 2 * kPeakLanes * kPeakSteps * st.iterations(), benchmark::Counter::kIsRate);
}
#endif

#if KVQ_CPU_AMX
// tdpbf16ps (the int8 mode's fp8 kernels where cpu::amx()): 16 x 16 x 32 bf16 products an
// instruction, 4 independent accumulator tiles (tmm0..3) of full size over tmm4, 5 x tmm6, 7. On a
// thread of its own: a tile configuration is per thread, and the kernels keep theirs loaded.
void BM_AmxPeak(benchmark::State& st) {
  constexpr int64_t kSteps = 1 << 16;  // 4 instructions each
  auto run = [] {
    static const cpu::TileConfig cfg = [] {  // 16 rows of 64 bytes for tmm0..7
      cpu::TileConfig c;
      for (int t = 0; t < 8; ++t) c.shape(t, 16, 64);
      return c;
    }();
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t i = 0; i < kSteps; ++i) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_release();
  };
  for (auto _ : st) std::thread(run).join();
  st.counters["amx_products"] = benchmark::Counter(4.0 * 16 * 16 * 32 * kSteps * st.iterations(),
                                                   benchmark::Counter::kIsRate);
}
#endif

std::string case_name(const std::string& backend, const std::string& s, int64_t T, int threads) {
  return "BM_Decode/" + backend + "/" + s + "/T" + std::to_string(T) +
         "/threads:" + std::to_string(threads);
}

// Collects every run (median when repeated) and prints the ratio table after the console output.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  explicit RatioReporter(std::vector<std::string> backends) : backends_(std::move(backends)) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (!bench::is_summary(r)) continue;
      const std::string n =
          r.run_name.function_name + (r.run_name.args.empty() ? "" : "/" + r.run_name.args);
      std::string key = r.run_name.function_name;
      const auto slash = key.find("/real_time");
      if (slash != std::string::npos) key.erase(slash);
      times_[key] = r.GetAdjustedRealTime() > 0 && r.run_name.time_type == "real_time"
                        ? r.GetAdjustedRealTime()
                        : r.GetAdjustedCPUTime();
      if (r.counters.count("bytes_per_second")) bw_[key] = r.counters.at("bytes_per_second");
      for (const char* c : {"lane_fma", "products", "bf16_products", "amx_products"})
        if (r.counters.count(c)) peak_[c] = r.counters.at(c);
      (void)n;
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    const double copy_bw = bw_.count("BM_Copy") ? bw_["BM_Copy"] : 0;
    std::printf(
        "\nbackend cpu ISA: %s. speedup = same backend's bf16 time / this time (same context, "
        "threads); cpu/ref = ref time / cpu time; of_copy = (stored bytes / time) / memcpy "
        "bandwidth\n",
        cpu::isa());
    std::printf(
        "of_read = (stored bytes / time) / the read stream on as many threads; of_peak = the "
        "case's multiply-adds (2 T H D GQA: keys and values) / time over the threads' peak: "
        "fp32 FMA lanes (ref, cpu), byte products of vpdpbusd (cpu-int8 kivi), bf16 products of "
        "vdpbf16ps (cpu-int8 fp8; of tdpbf16ps where the ISA ends in +amx)\n");
    std::printf("%-9s %-22s %7s %3s %10s %8s %8s %8s %7s %7s %7s\n", "backend", "scheme", "context",
                "thr", "us/query", "speedup", "cpu/ref", "GB/s", "of_copy", "of_read", "of_peak");
    for (int threads : {1, 2})
      for (int64_t T : g_contexts)
        for (const auto& b : backends_)
          for (const auto& s : kSchemes) {
            const std::string n = case_name(b, s, T, threads);
            const std::string base = case_name(b == "cpu-int8" ? "cpu" : b, "bf16", T, threads);
            const std::string ref = case_name("ref", s, T, threads);
            if (!times_.count(n)) continue;
            const double bw = bw_.count(n) ? bw_[n] : 0;
            const double sp = times_.count(base) ? times_[base] / times_[n] : 0;
            const double vs_ref = times_.count(ref) ? times_[ref] / times_[n] : 0;
            const std::string rs = "BM_ReadStream/threads:" + std::to_string(threads);
            const double read_bw = bw_.count(rs) ? bw_[rs] : 0;
            const bool fp8 = s.rfind("fp8", 0) == 0;
            const auto pk = peak_.find(b != "cpu-int8" ? "lane_fma"
                                       : !fp8          ? "products"
                                       : cpu::amx()    ? "amx_products"
                                                       : "bf16_products");
            const double peak = pk == peak_.end() ? 0.0 : pk->second * threads;
            const double macs = 2.0 * static_cast<double>(T) * kHeads * kDim * kGqa;
            std::printf("%-9s %-22s %7ld %3d %10.1f %7.2fx %7.2fx %8.2f %6.0f%% %6.0f%% %6.0f%%\n",
                        b.c_str(), s.c_str(), static_cast<long>(T), threads, times_[n], sp, vs_ref,
                        bw / 1e9, copy_bw > 0 ? 100.0 * bw / copy_bw : 0.0,
                        read_bw > 0 ? 100.0 * bw / read_bw : 0.0,
                        peak > 0 ? 100.0 * macs / (times_[n] * 1e-6) / peak : 0.0);
          }
    if (copy_bw > 0) std::printf("memcpy bandwidth: %.2f GB/s\n", copy_bw / 1e9);
    for (int th : {1, 2}) {
      const std::string rs = "BM_ReadStream/threads:" + std::to_string(th);
      if (bw_.count(rs)) std::printf("read stream, %d thread(s): %.2f GB/s\n", th, bw_[rs] / 1e9);
    }
    if (peak_.count("lane_fma"))
      std::printf("fp32 FMA peak, one core: %.1f G lanes/s\n", peak_.at("lane_fma") / 1e9);
    if (peak_.count("products"))
      std::printf("vpdpbusd peak, one core: %.1f G byte products/s\n", peak_.at("products") / 1e9);
    if (peak_.count("bf16_products"))
      std::printf("vdpbf16ps peak, one core: %.1f G bf16 products/s\n",
                  peak_.at("bf16_products") / 1e9);
    if (peak_.count("amx_products"))
      std::printf("tdpbf16ps (AMX) peak, one core: %.1f G bf16 products/s\n",
                  peak_.at("amx_products") / 1e9);
  }

 private:
  std::vector<std::string> backends_;
  std::map<std::string, double> times_, bw_, peak_;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string backend = kvq::bench::take_flag(argc, argv, "backend", "both");
  const std::string int_mode = kvq::bench::take_flag(argc, argv, "int-mode", "both");
  const std::string contexts = kvq::bench::take_flag(argc, argv, "contexts", "");
  const std::string shape = kvq::bench::take_flag(argc, argv, "shape", "");
  const std::string kv = kvq::bench::take_flag(argc, argv, "kv", "");
  const std::string l3 = kvq::bench::take_flag(argc, argv, "l3-bytes", "-1");
  {
    const std::optional<long long> b = kvq::whole_number(l3);
    if (!b || *b < -1) {
      std::fprintf(stderr,
                   "bench_attention: --l3-bytes=%s: expected a byte count, or -1 for the "
                   "system's L3\n",
                   l3.c_str());
      return 2;
    }
    cpu::set_l3_bytes(*b);
  }
  if (!kv.empty()) {  // specs hold commas: '|' separates them
    kSchemes.clear();
    std::stringstream ss(kv);
    for (std::string x; std::getline(ss, x, '|');) {
      try {
        kSchemes.push_back(parse_spec(x).canonical());
      } catch (const kvq::Error& e) {
        std::fprintf(stderr, "bench_attention: --kv: %s\n", e.what());
        return 2;
      }
    }
    // The speed-up column is against bf16 in the same run: always measure it.
    if (std::find(kSchemes.begin(), kSchemes.end(), "bf16") == kSchemes.end())
      kSchemes.insert(kSchemes.begin(), "bf16");
  }
  if (!shape.empty() &&
      std::sscanf(shape.c_str(), "%ld,%ld,%ld", &kHeads, &kDim, &kGqa) != 3) {  // NOLINT
    std::fprintf(stderr, "bench_attention: --shape=H,D,GQA, for example --shape=3,64,3\n");
    return 2;
  }
  if (!contexts.empty()) {
    g_contexts.clear();
    std::stringstream ss(contexts);
    for (std::string x; std::getline(ss, x, ',');) {
      const std::optional<long long> t = kvq::whole_number(x);
      if (!t || *t < 1) {
        std::fprintf(stderr,
                     "bench_attention: --contexts=%s: expected token counts >= 1, "
                     "for example --contexts=1024,4096\n",
                     contexts.c_str());
        return 2;
      }
      g_contexts.push_back(*t);
    }
  }
  std::vector<std::string> backends;
  if (backend == "ref" || backend == "both") backends.push_back("ref");
  if (backend == "cpu" || backend == "both") {
    if (int_mode == "exact" || int_mode == "both") backends.push_back("cpu");
    if (int_mode == "int8" || int_mode == "both") backends.push_back("cpu-int8");
  }
  if (backends.empty()) {
    std::fprintf(stderr, "bench_attention: --backend=%s: expected ref, cpu or both\n",
                 backend.c_str());
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RegisterBenchmark("BM_Copy", BM_Copy)
      ->Unit(benchmark::kMicrosecond)
      ->MeasureProcessCPUTime();
  benchmark::RegisterBenchmark("BM_ReadStream/threads:1", BM_ReadStream, 1)
      ->Unit(benchmark::kMicrosecond)
      ->MeasureProcessCPUTime();
  benchmark::RegisterBenchmark("BM_ReadStream/threads:2", BM_ReadStream, 2)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
#if KVQ_CPU_AVX2
  benchmark::RegisterBenchmark("BM_FmaPeak", BM_FmaPeak)
      ->Unit(benchmark::kMicrosecond)
      ->MeasureProcessCPUTime();
#if KVQ_CPU_VNNI
  benchmark::RegisterBenchmark("BM_DpbusdPeak", BM_DpbusdPeak)
      ->Unit(benchmark::kMicrosecond)
      ->MeasureProcessCPUTime();
#endif
#if KVQ_CPU_BF16DOT
  benchmark::RegisterBenchmark("BM_Bf16DotPeak", BM_Bf16DotPeak)
      ->Unit(benchmark::kMicrosecond)
      ->MeasureProcessCPUTime();
#endif
#if KVQ_CPU_AMX
  if (cpu::amx())
    benchmark::RegisterBenchmark("BM_AmxPeak", BM_AmxPeak)
        ->Unit(benchmark::kMicrosecond)
        ->MeasureProcessCPUTime();
#endif
#endif
  for (int threads : {1, 2})
    for (int64_t T : g_contexts)
      for (const auto& b : backends)
        for (const auto& s : kSchemes) {
          // the int8 mode changes kivi's codes (byte dots) and fp8's (bf16 dots), nothing else
          if (b == "cpu-int8" && s.rfind("kivi", 0) != 0 && s.rfind("fp8", 0) != 0) continue;
          auto* bm = benchmark::RegisterBenchmark(
              case_name(b, s, T, threads).c_str(),
              [b, s, T, threads](benchmark::State& st) { BM_Decode(st, b, s, T, threads); });
          bm->Unit(benchmark::kMicrosecond);
          if (threads == 1)
            bm->MeasureProcessCPUTime();
          else
            bm->UseRealTime();
        }
  RatioReporter rep(backends);
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();
  return 0;
}
