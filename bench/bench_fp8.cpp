// FP8 quantize + dequantize throughput on the CPU (fp8/scale.h reference path).
//
// One layer's cache tensor [4096 tokens, 8 heads, 128 dim] in float32 (16 MiB). Each iteration
// computes dynamic scales, quantizes to FP8 codes and dequantizes back to float32. Bytes
// processed are the input bytes, so GB/s (counter "GB/s", 10^9) compares directly with BM_Copy,
// a plain memcpy of the same bytes in the same run: the ratio is the figure that matters.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "fp8/scale.h"

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

void BM_Fp8QuantDequant(benchmark::State& state, Fp8Format format, Granularity gran) {
  const Tensor3& x = input();
  Fp8Spec spec;
  spec.format = format;
  spec.gran = gran;
  spec.source = ScaleSource::Dynamic;
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

BENCHMARK(BM_Copy)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Fp8QuantDequant, e4m3_tensor, Fp8Format::E4M3, Granularity::Tensor)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Fp8QuantDequant, e4m3_head, Fp8Format::E4M3, Granularity::Head)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Fp8QuantDequant, e4m3_token, Fp8Format::E4M3, Granularity::Token)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Fp8QuantDequant, e4m3_channel, Fp8Format::E4M3, Granularity::Channel)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Fp8QuantDequant, e5m2_token, Fp8Format::E5M2, Granularity::Token)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvq

BENCHMARK_MAIN();
