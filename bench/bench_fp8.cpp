// FP8 quantize throughput on the CPU: backend ref (fp8/scale.h) beside backend cpu
// (kernels/cpu/fp8.h, bit-identical codes) in one run.
//
// One layer's cache tensor [4096 tokens, 8 heads, 128 dim] in float32 (16 MiB). BM_Fp8Quantize
// computes dynamic scales (the amax pass) and quantizes to FP8 codes; BM_Fp8QuantDequant (ref)
// also dequantizes back. Bytes processed are the input bytes, so GB/s (10^9) compares directly
// with BM_Copy, a plain memcpy of the same bytes in the same run; the table printed at the end
// gives the fraction of memcpy and cpu's speedup over ref.
//   build/bench/bench_fp8 --benchmark_repetitions=3 --benchmark_enable_random_interleaving=true
//   [--backend=ref|cpu|both]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_ratio.h"
#include "fp8/scale.h"
#include "kernels/cpu/fp8.h"

namespace kvq {
namespace {

constexpr Shape3 kShape{4096, 8, 128};

/// Fixed-seed input: normal values with an outlier channel (d % 16 == 5, x30), as KV keys have.
const Tensor3& input() {
  static const Tensor3 x = [] {
    Tensor3 t(kShape);
    std::mt19937 rng(20240607);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    size_t i = 0;
    for (int64_t r = 0; r < kShape.tokens * kShape.heads; ++r)
      for (int64_t d = 0; d < kShape.dim; ++d, ++i)
        t.data[i] = normal(rng) * (d % 16 == 5 ? 30.0f : 1.0f);
    return t;
  }();
  return x;
}

void set_rate(benchmark::State& state) {
  const double bytes = static_cast<double>(input().data.size() * sizeof(float));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * bytes / 1e9,
                                              benchmark::Counter::kIsRate);
}

Fp8Spec dynamic_spec(Fp8Format format, Granularity gran) {
  Fp8Spec spec;
  spec.format = format;
  spec.gran = gran;
  spec.source = ScaleSource::Dynamic;
  return spec;
}

void BM_Fp8QuantDequant(benchmark::State& state, Fp8Format format, Granularity gran) {
  const Tensor3& x = input();
  const Fp8Spec spec = dynamic_spec(format, gran);
  std::vector<uint8_t> codes(x.data.size());
  Tensor3 y(x.shape);
  for (auto _ : state) {
    const std::vector<float> scales = fp8::compute_scales(spec, Role::Key, x);
    fp8::quantize(spec, scales, x, codes);
    fp8::dequantize(spec, scales, codes, y);
    benchmark::DoNotOptimize(y.data.data());
    benchmark::ClobberMemory();
  }
  set_rate(state);
}

void BM_Fp8Quantize(benchmark::State& state, bool cpu, Fp8Format format, Granularity gran) {
  const Tensor3& x = input();
  const Fp8Spec spec = dynamic_spec(format, gran);
  std::vector<uint8_t> codes(x.data.size());
  std::vector<float> scales;
  for (auto _ : state) {
    if (cpu) {
      cpu::fp8_quantize_dynamic(spec, Role::Key, x, scales, codes);
    } else {
      const std::vector<float> scales = fp8::compute_scales(spec, Role::Key, x);
      fp8::quantize(spec, scales, x, codes);
    }
    benchmark::DoNotOptimize(codes.data());
    benchmark::ClobberMemory();
  }
  set_rate(state);
}

void BM_Copy(benchmark::State& state) {
  const Tensor3& x = input();
  std::vector<float> dst(x.data.size());
  for (auto _ : state) {
    std::memcpy(dst.data(), x.data.data(), x.data.size() * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_rate(state);
}

void register_all(const std::string& backend) {
  benchmark::RegisterBenchmark("BM_Copy", BM_Copy)->Unit(benchmark::kMillisecond);
  const std::pair<Fp8Format, Granularity> cases[] = {
      {Fp8Format::E4M3, Granularity::Tensor}, {Fp8Format::E4M3, Granularity::Head},
      {Fp8Format::E4M3, Granularity::Token},  {Fp8Format::E4M3, Granularity::Channel},
      {Fp8Format::E5M2, Granularity::Token},  {Fp8Format::E4M3FNUZ, Granularity::Token}};
  for (const auto& [f, g] : cases)
    for (bool cpu : {false, true}) {
      if ((cpu && backend == "ref") || (!cpu && backend == "cpu")) continue;
      const std::string name = std::string("BM_Fp8Quantize/") + (cpu ? "cpu/" : "ref/") +
                               std::string(to_string(f)) + "_" + std::string(to_string(g));
      benchmark::RegisterBenchmark(name.c_str(), BM_Fp8Quantize, cpu, f, g)
          ->Unit(benchmark::kMillisecond);
    }
  if (backend != "cpu")
    benchmark::RegisterBenchmark("BM_Fp8QuantDequant/ref/e4m3_token", BM_Fp8QuantDequant,
                                 Fp8Format::E4M3, Granularity::Token)
        ->Unit(benchmark::kMillisecond);
}

}  // namespace
}  // namespace kvq

int main(int argc, char** argv) { return kvq::bench::ratio_main(argc, argv, kvq::register_all); }
