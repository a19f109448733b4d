// CUDA bench: FP8 quantize throughput (kvq::cuda::fp8_quantize, fp8_dynamic_scales and
// fp8_quantize_dynamic_token, kernels/cuda/fp8_kernels.cu) at every granularity (tensor, head,
// token, channel) on one layer's [32768 tokens, 8 heads, 128 dim] float32 tensor, against a
// device-to-device copy of the same tensor in the same run; the companion of bench_kivi_cuda, with
// its conventions.
//
// Two cases per granularity, and a third per token:
// - fp8_<format>_<gran>: fp8_quantize with the scales already on the device (static or
//   calibrated scales; what an append does once the scales are known).
// - fp8_<format>_<gran>_dynamic: fp8_dynamic_scales then fp8_quantize (two passes over x: the
//   amax reduction, then the codes), what an append with dynamic scales costs.
// - fp8_<format>_token_dynamic_fused: fp8_quantize_dynamic_token, the same scales and codes in
//   one pass (x read once; what backend cuda's per-token append runs).
// Reported per case (STYLE 10): the bytes the result needs moved (x read once, the codes
// written, the scales read or written; the dynamic case reads x twice, so its GB/s on these bytes
// is at most about 5/9 of a single pass's), the median kernel time over --runs runs timed with
// cudaEvents, each run after the L2 cache was flushed by writing a buffer of twice its size,
// GB/s (10^9 bytes / s), the fraction of peak DRAM bandwidth (2 * memory clock * bus width, from
// the device; or --peak-gbps) and the ratio to the copy's GB/s. --json PATH writes the same as
// JSON. Issue 46's goal: every quantize case at >= 80% of peak.
// Without a CUDA device (none present, or none visible: CUDA_VISIBLE_DEVICES="") it prints one
// line, "bench_fp8_cuda: no CUDA device: <the runtime's reason>", on stderr and exits 2 (1 is any
// other error); with --json it still writes a record that it measured nothing.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda_bench.h"
#include "core/error.h"
#include "core/spec.h"
#include "core/tensor.h"
#include "fp8/scale.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_kernels.cuh"

namespace {

constexpr int kNoDeviceExit = 2;  // exit status without a CUDA device (scripts/device-check.sh)

using kvq::Fp8Format;
using kvq::Granularity;
using kvq::Shape3;
using kvq::bench::Device;
using kvq::bench::DeviceArray;
using kvq::bench::median_ms;

struct Result {
  std::string name;
  std::string gran;
  bool dynamic = false;
  bool fused = false;
  double bytes = 0;
  double median_ms = 0;
  double gbps = 0;
  double pct_peak = 0;
  double vs_copy = 0;
};

int run(int argc, char** argv) {
  CLI::App app{"FP8 quantize CUDA throughput vs peak DRAM bandwidth, every granularity"};
  std::string json_path, format_name = "e4m3";
  double peak_flag = 0;
  int runs = 21;
  int64_t tokens = 32768, heads = 8, dim = 128;
  const std::map<std::string, Fp8Format> formats = {
      {"e4m3", Fp8Format::E4M3}, {"e4m3fnuz", Fp8Format::E4M3FNUZ}, {"e5m2", Fp8Format::E5M2}};
  app.add_option("--json", json_path, "write the results as JSON to this path");
  app.add_option("--peak-gbps", peak_flag, "peak DRAM bandwidth in GB/s (default: from the device)")
      ->check(CLI::PositiveNumber);
  app.add_option("--runs", runs, "timed runs per case (median reported)")
      ->check(CLI::Range(1, 10000));
  app.add_option("--tokens", tokens, "tokens T")->check(CLI::PositiveNumber);
  app.add_option("--heads", heads, "kv heads H")->check(CLI::PositiveNumber);
  app.add_option("--dim", dim, "head_dim D")->check(CLI::PositiveNumber);
  app.add_option("--format", format_name, "fp8 format: e4m3, e4m3fnuz or e5m2")
      ->check(CLI::IsMember({"e4m3", "e4m3fnuz", "e5m2"}));
  CLI11_PARSE(app, argc, argv);

  if (!kvq::bench::have_device("bench_fp8_cuda", json_path)) return kNoDeviceExit;
  const Fp8Format format = formats.at(format_name);
  const Device dev = kvq::bench::query_device(peak_flag);
  const Shape3 shape{tokens, heads, dim};
  const size_t n = static_cast<size_t>(shape.numel());

  std::vector<float> host(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : host) v = normal(rng);
  DeviceArray<float> x(n), copy(n);
  DeviceArray<uint8_t> codes(n);
  KVQ_CUDA_CHECK(cudaMemcpy(x.ptr, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  const size_t flush_bytes = kvq::bench::flush_bytes_for(dev);
  DeviceArray<uint8_t> flush(flush_bytes);

  // Baseline: a device-to-device copy of the input (reads and writes n floats).
  const double copy_ms = median_ms(runs, flush, flush_bytes, [&] {
    return cudaMemcpyAsync(copy.ptr, x.ptr, n * sizeof(float), cudaMemcpyDeviceToDevice);
  });
  const double copy_bytes = 2.0 * n * sizeof(float);
  const double copy_gbps = copy_bytes / 1e9 / (copy_ms / 1e3);

  std::vector<Result> results;
  results.push_back({"copy_fp32", "-", false, false, copy_bytes, copy_ms, copy_gbps,
                     100.0 * copy_gbps / dev.peak_gbps, 1.0});
  for (Granularity gran :
       {Granularity::Tensor, Granularity::Head, Granularity::Token, Granularity::Channel}) {
    const int64_t scale_count = kvq::fp8::scale_count(gran, shape);
    DeviceArray<float> scales(static_cast<size_t>(scale_count));
    // The scales the timed quantize reads: this tensor's own dynamic scales.
    KVQ_CUDA_CHECK(kvq::cuda::fp8_dynamic_scales(format, gran, shape, x.ptr, scales.ptr));
    KVQ_CUDA_CHECK(cudaDeviceSynchronize());
    for (int mode = 0; mode < (gran == Granularity::Token ? 3 : 2); ++mode) {
      const bool dynamic = mode >= 1, fused = mode == 2;
      const double ms = median_ms(runs, flush, flush_bytes, [&]() -> cudaError_t {
        if (fused)
          return kvq::cuda::fp8_quantize_dynamic_token(format, shape, x.ptr, scales.ptr, codes.ptr);
        if (dynamic) {
          const cudaError_t e =
              kvq::cuda::fp8_dynamic_scales(format, gran, shape, x.ptr, scales.ptr);
          if (e != cudaSuccess) return e;
        }
        return kvq::cuda::fp8_quantize(format, gran, shape, x.ptr, scales.ptr, codes.ptr);
      });
      Result r;
      r.gran = std::string(kvq::to_string(gran));
      r.dynamic = dynamic;
      r.fused = fused;
      r.name = "fp8_" + format_name + "_" + r.gran + (dynamic ? "_dynamic" : "") +
               (fused ? "_fused" : "");
      r.bytes = n * 4.0 + n * 1.0 + scale_count * 4.0;  // x, codes, scales
      r.median_ms = ms;
      r.gbps = r.bytes / 1e9 / (ms / 1e3);
      r.pct_peak = 100.0 * r.gbps / dev.peak_gbps;
      r.vs_copy = r.gbps / copy_gbps;
      results.push_back(r);
    }
  }

  std::printf("%s, peak %.0f GB/s (%s), L2 %zu MiB flushed with %zu MiB, median of %d runs\n",
              dev.name.c_str(), dev.peak_gbps, dev.peak_source.c_str(), dev.l2_bytes >> 20,
              flush_bytes >> 20, runs);
  std::printf(
      "shape [T=%lld, H=%lld, D=%lld], format %s; _dynamic: scales pass + quantize, GB/s on "
      "the single-pass bytes; _fused: one pass\n",
      static_cast<long long>(tokens), static_cast<long long>(heads), static_cast<long long>(dim),
      format_name.c_str());
  kvq::bench::print_rates(results, 33);

  if (!json_path.empty()) {
    nlohmann::json j =
        kvq::bench::run_record("bench_fp8_cuda", dev, flush_bytes, tokens, heads, dim, runs);
    j["format"] = format_name;
    j["cases"] = nlohmann::json::array();
    for (const Result& r : results) {
      nlohmann::json c = kvq::bench::rate_json(r);
      c["granularity"] = r.gran;
      c["dynamic"] = r.dynamic;
      c["fused"] = r.fused;
      j["cases"].push_back(c);
    }
    kvq::bench::write_json(json_path, j);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kvq::bench::bench_main("bench_fp8_cuda", run, argc, argv);
}
