// Shared by the plain CUDA throughput benches (bench_kivi_cuda, bench_fp8_cuda): a device
// allocation, the device's peak DRAM bandwidth, and the cold-L2 median timing every such bench
// uses (STYLE 10): each timed run after writing a flush buffer of twice the L2, cudaEvents
// around the launch, the median of the runs after one warm-up call; the table, the JSON file and
// main's error line (bench_main, bench_attention_cuda's too).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace kvq::bench {

/// A device allocation freed on scope exit.
template <typename T>
struct DeviceArray {
  T* ptr = nullptr;
  explicit DeviceArray(size_t count) {
    void* p = nullptr;
    KVQ_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
    ptr = static_cast<T*>(p);
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

struct Device {
  std::string name;
  double peak_gbps = 0;  ///< 2 * memory clock * bus width (DDR), or --peak-gbps
  std::string peak_source;
  size_t l2_bytes = 0;
};

inline Device query_device(double peak_flag) {
  int dev = 0;
  KVQ_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  KVQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  // CUDA 13 dropped cudaDeviceProp::memoryClockRate; the attribute still reports it (kHz).
  int clock_khz = 0;
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev));
  Device d;
  d.name = prop.name;
  d.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  if (peak_flag > 0) {
    d.peak_gbps = peak_flag;
    d.peak_source = "flag";
  } else {
    d.peak_gbps = 2.0 * clock_khz * 1e3 * (prop.memoryBusWidth / 8.0) / 1e9;
    d.peak_source = "device: 2 x " + std::to_string(clock_khz / 1000) + " MHz x " +
                    std::to_string(prop.memoryBusWidth) + " bit";
  }
  return d;
}

/// Bytes of the L2 flush buffer: twice the L2, at least 64 MiB.
inline size_t flush_bytes_for(const Device& d) {
  return std::max<size_t>(2 * d.l2_bytes, size_t{64} << 20);
}

/// Median over `runs` of `launch`'s time, each run after writing `flush` (cold L2).
template <typename Launch>
double median_ms(int runs, DeviceArray<uint8_t>& flush, size_t flush_bytes, Launch&& launch) {
  cudaEvent_t start, stop;
  KVQ_CUDA_CHECK(cudaEventCreate(&start));
  KVQ_CUDA_CHECK(cudaEventCreate(&stop));
  KVQ_CUDA_CHECK(launch());  // warm-up: module load, first-touch of the outputs
  std::vector<float> ms;
  for (int r = 0; r < runs; ++r) {
    KVQ_CUDA_CHECK(cudaMemsetAsync(flush.ptr, r & 0xff, flush_bytes));
    KVQ_CUDA_CHECK(cudaEventRecord(start));
    KVQ_CUDA_CHECK(launch());
    KVQ_CUDA_CHECK(cudaEventRecord(stop));
    KVQ_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    KVQ_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  return n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
}

/// Whether a CUDA device is visible. If none is, prints one line, "<bench>: no CUDA device:
/// <the runtime's reason>", on stderr and, when json_path is given, writes a record that the
/// bench ran and measured nothing; the caller then exits 2 (scripts/device-check.sh reads it).
inline bool have_device(const char* bench, const std::string& json_path) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess && count > 0) return true;
  std::fprintf(stderr, "%s: no CUDA device: %s\n", bench,
               err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount returned 0");
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << nlohmann::json{{"bench", bench}, {"skipped", "no CUDA device"}}.dump(2) << "\n";
  }
  return false;
}

/// The fields every throughput bench's JSON starts with: the bench, the device and its peak, the
/// L2 flush, the [T, H, D] shape and the runs per case.
inline nlohmann::json run_record(const char* bench, const Device& d, size_t flush_bytes,
                                 int64_t tokens, int64_t heads, int64_t dim, int runs) {
  nlohmann::json j;
  j["bench"] = bench;
  j["device"] = d.name;
  j["peak_gbps"] = d.peak_gbps;
  j["peak_source"] = d.peak_source;
  j["l2_bytes"] = d.l2_bytes;
  j["flush_bytes"] = flush_bytes;
  j["shape"] = {tokens, heads, dim};
  j["runs"] = runs;
  return j;
}

/// One measured case of a throughput bench, the fields both tables and JSON share (R: the
/// bench's own Result with name, bytes, median_ms, gbps, pct_peak and vs_copy).
template <class R>
nlohmann::json rate_json(const R& r) {
  return {{"name", r.name}, {"bytes", r.bytes},       {"median_ms", r.median_ms},
          {"gbps", r.gbps}, {"pct_peak", r.pct_peak}, {"vs_copy", r.vs_copy}};
}

/// The cases as a table on stdout, the name column `width` wide.
template <class R>
void print_rates(const std::vector<R>& results, int width) {
  std::printf("%-*s %12s %10s %9s %8s %8s\n", width, "case", "MB moved", "ms", "GB/s", "% peak",
              "vs copy");
  for (const R& r : results)
    std::printf("%-*s %12.2f %10.4f %9.1f %8.1f %8.2f\n", width, r.name.c_str(), r.bytes / 1e6,
                r.median_ms, r.gbps, r.pct_peak, r.vs_copy);
}

/// Writes a bench's JSON record (--json PATH); a path that cannot be written is an error.
inline void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) throw std::runtime_error("cannot write --json " + path);
}

/// A bench's main: run(argc, argv), or a one-line "bench: message" on stderr and exit 1.
template <class Run>
int bench_main(const char* bench, Run run, int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", bench, e.what());
    return 1;
  }
}

}  // namespace kvq::bench
