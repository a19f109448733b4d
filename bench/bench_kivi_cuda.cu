// CUDA bench: KIVI quantize + pack throughput (kvq::cuda::kivi_quantize,
// kernels/cuda/kivi_kernels.cu) for kivi2 / kivi4 (asymmetric, G = 32), both axes, on one layer's
// [32768 tokens, 8 heads, 128 dim] float32 tensor, against a device-to-device copy of the same
// tensor in the same run.
//
// Reported per case (STYLE 10): the bytes it moves (input read + packed words + fp16 scales and
// minima written), the median kernel time over --runs runs timed with cudaEvents, each run after
// the L2 cache was flushed by writing a buffer of twice its size, GB/s (10^9 bytes / s), the
// fraction of peak DRAM bandwidth (2 * memory clock * bus width, from the device; or
// --peak-gbps), and the ratio to the copy's GB/s. --json PATH writes the same as JSON.
// Then a serving step (--requests caches of kivi2, keys per-channel and values per-token, g=32
// r=128, each prefilled with 1000 tokens): one token appended to every request's K and V, by
// one KiviSideCache::append per cache and by one append_batch per side; the host wall time of the
// step until the stream is idle (planning, launches and kernels), median of --runs steps.
// Without a CUDA device (none present, or none visible: CUDA_VISIBLE_DEVICES="") it prints one
// line, "bench_kivi_cuda: no CUDA device: <the runtime's reason>", on stderr and exits 2 (1 is any
// other error); with --json it still writes a record that it measured nothing.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda_bench.h"
#include "core/error.h"
#include "core/spec.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kivi_cache_device.cuh"
#include "kernels/cuda/kivi_kernels.cuh"
#include "kivi/layout.h"

namespace {

constexpr int kNoDeviceExit = 2;  // exit status without a CUDA device (scripts/device-check.sh)

using kvq::Axis;
using kvq::Shape3;

using kvq::bench::Device;
using kvq::bench::DeviceArray;
using kvq::bench::median_ms;
using kvq::bench::query_device;

struct Result {
  std::string name;
  int bits = 0;
  std::string axis;
  int group = 0;
  double bytes = 0;
  double median_ms = 0;
  double gbps = 0;
  double pct_peak = 0;
  double vs_copy = 0;
};

int run(int argc, char** argv) {
  CLI::App app{"KIVI quantize+pack CUDA throughput vs peak DRAM bandwidth"};
  std::string json_path;
  double peak_flag = 0;
  int runs = 21;
  int64_t tokens = 32768, heads = 8, dim = 128;
  int group = 32;
  int requests = 64;
  app.add_option("--json", json_path, "write the results as JSON to this path");
  app.add_option("--peak-gbps", peak_flag, "peak DRAM bandwidth in GB/s (default: from the device)")
      ->check(CLI::PositiveNumber);
  app.add_option("--runs", runs, "timed runs per case (median reported)")
      ->check(CLI::Range(1, 10000));
  app.add_option("--tokens", tokens, "tokens T")->check(CLI::PositiveNumber);
  app.add_option("--heads", heads, "kv heads H")->check(CLI::PositiveNumber);
  app.add_option("--dim", dim, "head_dim D")->check(CLI::PositiveNumber);
  app.add_option("--group", group, "group size G")->check(CLI::PositiveNumber);
  app.add_option("--requests", requests, "requests in the serving-step comparison")
      ->check(CLI::Range(1, 4096));
  CLI11_PARSE(app, argc, argv);

  if (!kvq::bench::have_device("bench_kivi_cuda", json_path)) return kNoDeviceExit;
  if (tokens % group != 0 || group > dim)
    throw kvq::Error("--tokens must be a multiple of --group and --group <= --dim (got T=" +
                     std::to_string(tokens) + ", G=" + std::to_string(group) +
                     ", D=" + std::to_string(dim) + ")");
  const Device dev = query_device(peak_flag);
  const Shape3 shape{tokens, heads, dim};
  const size_t n = static_cast<size_t>(shape.numel());

  std::vector<float> host(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : host) v = normal(rng);
  DeviceArray<float> x(n), copy(n);
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
  results.push_back({"copy_fp32", 32, "-", 0, copy_bytes, copy_ms, copy_gbps,
                     100.0 * copy_gbps / dev.peak_gbps, 1.0});
  for (int bits : {2, 4})
    for (Axis axis : {Axis::Channel, Axis::Token}) {
      int64_t words = 0, params = 0;
      if (axis == Axis::Channel) {
        const kvq::kivi::ChannelLayout lay{heads, dim, group, bits};
        words = lay.words_for_tokens(tokens);
        params = lay.params_for_tokens(tokens);
      } else {
        const kvq::kivi::TokenLayout lay{heads, dim, group, bits};
        words = lay.words_for_tokens(tokens);
        params = lay.params_for_tokens(tokens);
      }
      DeviceArray<uint32_t> w(static_cast<size_t>(words));
      DeviceArray<uint16_t> s(static_cast<size_t>(params)), m(static_cast<size_t>(params));
      const double ms = median_ms(runs, flush, flush_bytes, [&] {
        return kvq::cuda::kivi_quantize(axis, bits, false, group, shape, x.ptr, w.ptr, s.ptr,
                                        m.ptr);
      });
      Result r;
      r.name = "kivi" + std::to_string(bits) + "_" + std::string(kvq::to_string(axis)) + "_g" +
               std::to_string(group);
      r.bits = bits;
      r.axis = std::string(kvq::to_string(axis));
      r.group = group;
      r.bytes = n * 4.0 + words * 4.0 + params * 2.0 * 2.0;  // x, words, scales + mins
      r.median_ms = ms;
      r.gbps = r.bytes / 1e9 / (ms / 1e3);
      r.pct_peak = 100.0 * r.gbps / dev.peak_gbps;
      r.vs_copy = r.gbps / copy_gbps;
      results.push_back(r);
    }

  // Serving step: per-request appends against one batched append per side, same caches.
  std::vector<kvq::cuda::KiviSideCache> kc, vc;
  const kvq::IntSpec kivi2 = [] {
    kvq::IntSpec q;
    q.bits = 2;
    q.group = 32;
    q.residual = 128;
    q.key_axis = Axis::Channel;
    q.value_axis = Axis::Token;
    return q;
  }();
  const int64_t kPrefill = std::min<int64_t>(1000, tokens);  // x holds the prefill tokens
  const int64_t steps = 2 * static_cast<int64_t>(runs) + 2;
  for (int r = 0; r < requests; ++r) {
    kc.emplace_back(kivi2, kvq::Role::Key, heads, dim);
    vc.emplace_back(kivi2, kvq::Role::Value, heads, dim);
    KVQ_CUDA_CHECK(kc.back().reserve(kPrefill + steps));
    KVQ_CUDA_CHECK(vc.back().reserve(kPrefill + steps));
    KVQ_CUDA_CHECK(kc.back().append(x.ptr, kPrefill));
    KVQ_CUDA_CHECK(vc.back().append(x.ptr, kPrefill));
  }
  std::vector<kvq::cuda::KiviSideCache*> kp, vp;
  for (int r = 0; r < requests; ++r) {
    kp.push_back(&kc[static_cast<size_t>(r)]);
    vp.push_back(&vc[static_cast<size_t>(r)]);
  }
  const std::vector<const float*> one_token(static_cast<size_t>(requests), x.ptr);
  const std::vector<int64_t> ones(static_cast<size_t>(requests), 1);
  const auto step_us = [&](bool batched) {
    const auto t0 = std::chrono::steady_clock::now();
    if (batched) {
      KVQ_CUDA_CHECK(kvq::cuda::KiviSideCache::append_batch(kp, one_token, ones));
      KVQ_CUDA_CHECK(kvq::cuda::KiviSideCache::append_batch(vp, one_token, ones));
    } else {
      for (int r = 0; r < requests; ++r) {
        KVQ_CUDA_CHECK(kc[static_cast<size_t>(r)].append(x.ptr, 1));
        KVQ_CUDA_CHECK(vc[static_cast<size_t>(r)].append(x.ptr, 1));
      }
    }
    KVQ_CUDA_CHECK(cudaDeviceSynchronize());
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> each_us, batch_us;
  (void)step_us(false);  // warm-up
  (void)step_us(true);
  for (int r = 0; r < runs; ++r) {  // interleaved
    each_us.push_back(step_us(false));
    batch_us.push_back(step_us(true));
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t m = v.size();
    return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
  };
  const double each_med = median(each_us), batch_med = median(batch_us);

  std::printf("%s, peak %.0f GB/s (%s), L2 %zu MiB flushed with %zu MiB, median of %d runs\n",
              dev.name.c_str(), dev.peak_gbps, dev.peak_source.c_str(), dev.l2_bytes >> 20,
              flush_bytes >> 20, runs);
  std::printf("shape [T=%lld, H=%lld, D=%lld]\n", static_cast<long long>(tokens),
              static_cast<long long>(heads), static_cast<long long>(dim));
  kvq::bench::print_rates(results, 22);

  std::printf(
      "serving step, %d requests x 1 token, kivi2 K and V (prefill %lld): per-request "
      "appends %.1f us, append_batch %.1f us (%.2fx)\n",
      requests, static_cast<long long>(kPrefill), each_med, batch_med, each_med / batch_med);

  if (!json_path.empty()) {
    nlohmann::json j;
    j["serving_step"] = {{"requests", requests},
                         {"prefill", kPrefill},
                         {"per_request_us", each_med},
                         {"append_batch_us", batch_med}};
    j.update(kvq::bench::run_record("bench_kivi_cuda", dev, flush_bytes, tokens, heads, dim, runs));
    j["cases"] = nlohmann::json::array();
    for (const Result& r : results) {
      nlohmann::json c = kvq::bench::rate_json(r);
      c["bits"] = r.bits;
      c["axis"] = r.axis;
      c["group"] = r.group;
      j["cases"].push_back(c);
    }
    kvq::bench::write_json(json_path, j);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kvq::bench::bench_main("bench_kivi_cuda", run, argc, argv);
}
