// Backend cuda's cache side and decode call as plain C++ (no CUDA types: the backend interface,
// kernels/backend.cpp, includes it): one side (K or V) of one layer's cache whose bytes live in
// device memory, appended through the CUDA quantize kernels (from device rows, or from host rows
// uploaded first), and decode attention
// over a batch of such sides through the CUDA decode kernels (attention_kernels.cuh).
//
//   bf16  [T, H, D] bf16 bits: converted on the device by model::to_bf16 (core/half.h's
//         float_to_bf16_bits itself, __host__ __device__: the CPU side's rounding)
//   fp8   codes [T, H, D] and float32 scales (fp8/scale.h's layouts): per-token dynamic scales and
//         codes in one pass by fp8_quantize_dynamic_token on each append; constant and calib
//         scales read once on the host (fp8::compute_scales, as the CPU side) and applied by
//         fp8_quantize. Dynamic tensor / head / channel scales (first=N: exact tokens held
//         until N arrive) are not here.
//   int   the device KIVI cache (kivi_cache_device.cuh): kivi::SideCache's bytes, bit for bit
// The bytes of every kind equal the CPU side's (cache/side.h) after the same appends;
// host_copy() reads them back for the tests. rot= and sink= are not this file's: the backend
// layer rotates on the host (rot=) and sinks are refused (kernels/backend.h's support table).
//
// Every call works on the legacy default stream and returns once its work is queued (appends) or
// done (reads back, attention with host q / out). CUDA failures throw kvq::Error naming the call;
// without a usable device every call that would touch one throws the one line no_device_reason()
// gives ("backend cuda: no CUDA device (...)").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/footprint.h"
#include "core/spec.h"
#include "core/stored_side.h"

namespace kvq::cuda {

/// \brief Empty when a CUDA device is usable, else one line saying why not, starting "backend
/// cuda: no CUDA device" (cudaGetDeviceCount, asked once per process).
const std::string& no_device_reason();
/// \brief Throws kvq::Error with no_device_reason() unless a device is usable.
void require_device();

/// \brief What a throughput row records about the GPU (cudaGetDeviceProperties of device 0).
struct DeviceProps {
  std::string name;
  int driver_version = 0;   ///< cudaDriverGetVersion, e.g. 13000
  int runtime_version = 0;  ///< cudaRuntimeGetVersion
  int memory_clock_khz = 0;
  int bus_width_bits = 0;
  /// memory clock (kHz) x 1e3 x bus width (bits) / 8 x 2 (double data rate) / 1e9: the vendor's
  /// peak DRAM bandwidth in GB/s, as peak_formula states.
  double peak_gbps = 0;
  std::string peak_formula;
  int64_t total_memory = 0;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
};
/// \brief The properties of device 0 (throws without a device).
DeviceProps device_props();
/// \brief Device 0's memory in use now: cudaMemGetInfo's total - free (every allocation of every
/// process, the CUDA context included). Throws without a device.
int64_t device_memory_used();

/// \brief One side of one layer's cache in device memory (see the file comment). `spec` is one
/// side's scheme without rot= and sink= (SchemeSpec::base()); `layer` selects calib scales.
/// Throws kvq::Error naming what backend cuda does not store (device_side_unsupported) or, on the
/// first call that touches the device, why no device is usable.
class DeviceSide {
 public:
  DeviceSide(const SchemeSpec& spec, Role role, int64_t heads, int64_t dim, int layer = 0);
  ~DeviceSide();
  DeviceSide(DeviceSide&&) noexcept;
  DeviceSide& operator=(DeviceSide&&) noexcept;

  /// \brief Appends n tokens x [n, heads, dim] (float32, host memory): uploaded, then
  /// append_device.
  void append(const float* x, int64_t n);
  /// \brief Appends n tokens x [n, heads, dim] (float32, DEVICE memory): queued on the default
  /// stream, no copy to or from the host (x must stay valid until the queued work runs). The same
  /// bytes as append() of the same rows.
  void append_device(const float* x, int64_t n);
  /// \brief A serving step's appends: n tokens x[i] [n, heads, dim] (float32, DEVICE memory) to
  /// *sides[i] for every i, the same bytes as sides[i]->append_device(x[i], n) in turn. The sides
  /// must be distinct and of one scheme and shape. int: one KiviSideCache::append_batch (four
  /// launches per 32-64 sides); bf16: one conversion launch per kBf16Jobs sides; fp8: one quantize
  /// launch a side (the fp8 kernels take one tensor). Checks everything (throws kvq::Error naming
  /// the side) before anything is queued; a side that must grow reallocates first.
  static void append_batch(std::span<DeviceSide* const> sides, std::span<const float* const> x,
                           int64_t n);
  /// \brief Room for `tokens` tokens without reallocating.
  void reserve(int64_t tokens);
  int64_t tokens() const;
  int64_t heads() const;
  int64_t dim() const;
  /// \brief Tokens a side holding exactly t tokens keeps quantized (kvq::quantized_tokens for
  /// int; t otherwise).
  int64_t quantized_tokens_at(int64_t t) const;
  /// \brief The stored bytes as a view whose pointers are DEVICE pointers (valid until the next
  /// append): what backend cuda's decode reads. Never dereference them on the host.
  StoredSide device_view() const;
  /// \brief The exact residual rows [quantized, tokens) copied back, appended to `out`.
  void exact_tail(std::vector<float>& out) const;
  /// \brief Rows exact_tail_device writes for an append of n tokens: the exact residual rows now
  /// (tokens() - quantized_tokens_at(tokens())) + n.
  int64_t tail_tokens(int64_t n) const;
  /// \brief gather_exact_tail (cache/side.h) in device memory, for a causal call over
  /// an append of n tokens: the exact rows [quantized_tokens_at(tokens()), tokens()) followed by
  /// the n rows of x (DEVICE memory, row r at x + r * stride floats, heads * dim floats each) into
  /// `tail` (DEVICE memory, tail_tokens(n) rows). Queued on the default stream (two copies, no
  /// kernel). Returns the first token the tail covers. Call before appending x.
  int64_t exact_tail_device(const float* x, int64_t n, int64_t stride, float* tail) const;
  /// \brief Bytes stored: kvq::footprint of the scheme at tokens() (the CPU side's formula).
  Footprint footprint() const;

  /// \brief Everything stored, copied to the host, and a view over the copies (host pointers):
  /// for tests, which compare it byte for byte with the CPU side's stored().
  struct HostCopy {
    StoredSide view;
    std::vector<uint16_t> half16;        ///< bf16
    std::vector<uint8_t> codes;          ///< fp8
    std::vector<float> fp8_scales;       ///< fp8
    std::vector<uint32_t> words;         ///< int
    std::vector<uint16_t> scales, mins;  ///< int (mins empty for sym)
    std::vector<float> residual;         ///< int
  };
  HostCopy host_copy() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

/// \brief Empty when DeviceSide stores `spec` (one side, no rot= / sink=) in `role`, else one
/// phrase naming what it does not store (for the support table's errors).
std::string device_side_unsupported(const SchemeSpec& spec, Role role);

/// \brief Decode attention over device sides (CUDA decode kernels, DecodeKernel::Mma: the
/// tensor-core kernel where it covers the cache, else the tiled one; attention_kernels.cuh). Holds
/// the workspace and, for host calls, q and out buffers, grown as needed. One per thread.
class DeviceDecoder {
 public:
  DeviceDecoder();
  ~DeviceDecoder();
  DeviceDecoder(const DeviceDecoder&) = delete;
  DeviceDecoder& operator=(const DeviceDecoder&) = delete;

  /// \brief out[b] = decode attention of q[b] over (k[b], v[b]) for every sequence b: q and out
  /// [batch, q_heads, dim] float32 in DEVICE memory, k and v device views (DeviceSide::
  /// device_view) of one kind, shape and spec. Queued on the default stream (one launch per
  /// kMaxBatch sequences); returns without waiting.
  void run(std::span<const StoredSide> k, std::span<const StoredSide> v, int64_t q_heads,
           const float* q, float* out);
  /// \brief One sequence with q [q_heads, dim] and out in HOST memory: upload, run, download.
  void run_host(const StoredSide& k, const StoredSide& v, int64_t q_heads, const float* q,
                float* out);
  /// \brief Device scratch of at least `count` floats, slot `which` (0 .. 3), grown as needed
  /// (contents not kept; cudaFree on growth waits for the queued work): a causal call's exact
  /// tails, q and output (kernels/backend.cpp). Valid until the next call that grows it.
  float* scratch(int which, int64_t count);

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

/// \brief A float32 buffer in device memory (the throughput sweep's q and out).
class DeviceFloats {
 public:
  explicit DeviceFloats(int64_t count);
  ~DeviceFloats();
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() { return p_; }
  void upload(const float* host, int64_t count);
  void download(float* host, int64_t count) const;

 private:
  float* p_ = nullptr;
};

/// \brief host [n] = device [n] (float32; waits for the default stream's work first).
void download_floats(const float* device, int64_t n, float* host);
/// \brief device [n] = host [n] (float32).
void upload_floats(const float* host, int64_t n, float* device);

/// \brief Times fn (which queues device work on the default stream) with CUDA events: one warm-up
/// call, then `repeats` timed calls, each between its own pair of events; the median in
/// microseconds.
double time_events_us(const std::function<void()>& fn, int repeats);

/// \brief Device-to-device cudaMemcpy bandwidth of a `bytes`-byte buffer in GB/s (10^9 bytes
/// copied per second, each byte read once and written once), the median of `repeats` timed by
/// CUDA events: the achievable limit a decode row is compared with.
double copy_gbps(double bytes, int repeats);

}  // namespace kvq::cuda
