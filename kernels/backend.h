// The backend interface (issue 47, item 1): one list of the attention backends' names (ref, cpu,
// cpu-int8, cuda) with one parser, what each supports declared once (BackendSupport: scheme kinds x
// decode / causal x rot= / sink= / pre_rope, and backend cuda's kernel limits from
// kernels/cuda/dispatch.h), the cache sides each backend stores (make_backend_side: host memory,
// or device memory for cuda), and the attention calls over a side pair (decode and causal) with
// the rot= rotation handled once. The model, `kvq run`, the benches and Python choose and call a
// backend through here only. Sinks (sink=S) travel inside the sides (StoredSide::sink) and every
// host backend reads them there.
//
// Layer: above the backends (reference_cpu/, kernels/cpu/, kernels/cuda/), below model/
// (scripts/check-layers.py). Backend cuda is compiled in when KVQ_HAVE_CUDA; without it, or
// without a device, every cuda call throws one line saying which (cuda_unavailable()).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/side.h"
#include "kernels/cpu/attention.h"

namespace kvq {

/// \brief Which backend computes attention over the cache (all store the same bytes).
enum class AttentionBackend {
  kRef,  ///< reference_cpu/attention.h: the scalar definition
  kCpu,  ///< kernels/cpu/attention.h: SIMD kernels, threads over positions and context segments
  /// The same kernels in their int8 mode (integer dot products on 2/4-bit codes, bf16 dot
  /// products on FP8 codes, with the rounding error kernels/cpu/attention.h states); other
  /// caches as kCpu.
  kCpuInt8,
  /// kernels/cuda/: decode and causal attention over cache sides in device memory
  /// (make_backend_side); a causal call is one decode launch over its positions' views.
  kCuda,
};

/// \brief The attention calls a backend may run.
enum class AttentionOp {
  kDecode,  ///< one query token over the whole cache (attend_decode)
  kCausal,  ///< positions t_begin .. t_begin + n - 1, each over what a decode would see there
            ///< (attend_causal, CausalCall): prefill, and the model's every step
};
const char* to_string(AttentionOp op);

/// \brief What one backend runs, declared once: dispatch checks it (attend_decode, CausalCall,
/// make_backend_side), `--help` prints it (support_help), the config checker and the tests read it
/// (unsupported). A list left empty / a limit of 0: any value.
struct BackendSupport {
  bool decode = true, causal = true;  ///< AttentionOp::kDecode, kCausal
  /// Scheme kinds it reads, by SchemeKind: fp32, bf16, fp16, fp8, int. The one declaration of
  /// which backend reads a kind (core/schemes.h's registry says what a kind is, not who reads it).
  bool fp32 = true, bf16 = true, fp16 = true, fp8 = true, int_codes = true;
  /// \brief Whether it reads caches of kind `k` (the flags above, by kind).
  constexpr bool reads(SchemeKind k) const {
    switch (k) {
      case SchemeKind::Fp32:
        return fp32;
      case SchemeKind::Bf16:
        return bf16;
      case SchemeKind::Fp16:
        return fp16;
      case SchemeKind::Fp8:
        return fp8;
      case SchemeKind::Int:
        return int_codes;
    }
    return false;
  }
  /// fp8 dynamic scales per tensor / head / channel (first=N holds the first tokens exact).
  bool fp8_prefix_scales = true;
  bool int_fp16_arith = true;  ///< int / kivi arith=fp16
  bool rot = true;             ///< rot=hadamard: q rotated in, outputs rotated back
  bool sink = true;            ///< sink=S: the first S tokens exact beside the codes
  /// k=SPEC;v=SPEC whose sides differ in kind, bits or fp8 format.
  bool mixed_sides = true;
  bool model = true;     ///< runs the model (kvq model, [model], Python's Model)
  bool pre_rope = true;  ///< the model's pre-RoPE keys (KVQuant; needs `model`)
  std::span<const int> head_dims, bits;
  int max_gqa = 0, max_batch = 0;  ///< query heads per kv head; sequences per launch
};

/// \brief One backend as every caller sees it: the one list is backends().
struct BackendInfo {
  AttentionBackend id;
  const char* name;  ///< the flag's, the config's and Python's spelling
  const char* what;  ///< one phrase for --help and the parse error
  /// Its sides keep their bytes in host memory (make_side): every host caller (the model's
  /// cache, Python's Cache on ref/cpu) can read them. False for cuda (device memory).
  bool host;
  BackendSupport support;
};

/// \brief The one list, in the order --help and errors name them.
std::span<const BackendInfo> backends();
const BackendInfo& backend_info(AttentionBackend b);
/// \brief "ref" / "cpu" / "cpu-int8" / "cuda".
const char* to_string(AttentionBackend b);
/// \brief The names joined by `sep` ("ref, cpu, cpu-int8, cuda"); host_only: those with .host.
std::string backend_names(std::string_view sep = ", ", bool host_only = false);
/// \brief Throws kvq::Error "unknown backend 'S' (choices: ref, the scalar reference; ...)".
AttentionBackend parse_backend(std::string_view s);

/// \brief Empty when `b` runs `op` over every layer's scheme of `spec` (both sides), else one
/// phrase naming the first thing it does not (e.g. "sink=S (exact sink tokens)"). Static: whether
/// a device is present is cuda_unavailable()'s.
std::string unsupported(AttentionBackend b, const SchemeSpec& spec, AttentionOp op);
/// \brief Empty when `b` takes this shape (kv heads, head_dim, query heads, batch), else why not.
std::string unsupported_shape(AttentionBackend b, int64_t heads, int64_t dim, int64_t q_heads,
                              int64_t batch = 1);
/// \brief The backends that run `op` over `spec` (by the table), joined by ", ".
std::string backends_for(const SchemeSpec& spec, AttentionOp op);
/// \brief Throws kvq::Error unless `b` runs `op` over `spec`: "backend cuda cannot run decode
/// attention over 'SPEC': WHY (backends that can: ref, cpu, cpu-int8)".
void require_supported(AttentionBackend b, const SchemeSpec& spec, AttentionOp op);
/// \brief Throws kvq::Error unless `b` runs the model (its causal prefill and decode steps):
/// "backend X does not run the model yet (...); backends that run the model: ...". Every backend
/// runs it today (cuda: model/llama_cuda.cpp); the overload below also checks a cache scheme.
void require_model(AttentionBackend b);
/// \brief Empty when the model runs on `b` with a cache in `spec` (`pre_rope`: KVQuant's pre-RoPE
/// keys), else one phrase naming the first thing it does not: the model (support.model), pre_rope,
/// or a scheme of any layer the model's attention op on `b` does not read (its causal calls; on
/// cuda its chunked prefill and decode steps, model/llama_cuda.cpp). Static, as unsupported(): what
/// `kvq run --check`, the CLI and Python ask before the model loads.
std::string model_unsupported(AttentionBackend b, const SchemeSpec& spec, bool pre_rope = false);
/// \brief Throws model_unsupported's reason: "backend cuda cannot run the model with the cache
/// 'SPEC': it does not run WHY (backends that can: ref, cpu, cpu-int8)".
void require_model(AttentionBackend b, const SchemeSpec& spec, bool pre_rope = false);
/// \brief The unquantized cache the model's quality is measured against on `b` (the fp32_* fields
/// of ppl / needle / ruler rows): fp32 where `b` stores fp32 caches, else bf16 (cuda: the 16-bit
/// cache KIVI compares against).
SchemeSpec reference_spec(AttentionBackend b);
/// \brief Throws kvq::Error unless `b`'s sides live in host memory (BackendInfo::host): what a
/// host-only caller (the model's cache) asks.
void require_host(AttentionBackend b);
/// \brief Throws cuda_unavailable()'s one line when `b` is cuda and cannot run in this process
/// (nothing for a host backend): what every caller asks before long work (a model load, a run).
void require_available(AttentionBackend b);
/// \brief Empty when `b` can run in this process; for cuda, why not: "backend cuda: this kvq was
/// built without CUDA (...)" or "backend cuda: no CUDA device (...)" (cudaGetDeviceCount, asked
/// once). Tests that need a device skip with this line.
std::string cuda_unavailable();
/// \brief One line per backend for --help: its name, what it is, and what it runs.
std::string support_help();

/// \brief A cache side for backend `b`: make_side(..., side_kernels(b)) for the host backends;
/// for cuda a side whose bytes live in device memory (appended from the host through the CUDA
/// quantize kernels; bf16, fp8 with per-token or fixed scales, int / KIVI; rot= rotates on the
/// host), read only by attend_decode(cuda, ...). Throws require_supported's error (decode) and,
/// for cuda, cuda_unavailable()'s line.
std::unique_ptr<SideStore> make_backend_side(AttentionBackend b, const SchemeSpec& spec, Role role,
                                             int64_t heads, int64_t dim, int layer = 0);
/// \brief Whether `s` keeps its bytes in device memory (a backend cuda side).
bool on_device(const SideStore& s);
/// \brief The stored bytes of `s` as a host view: stored() for a host side; for a device side a
/// copy read back (the tests compare it byte for byte with a host side's stored()). `keep` owns
/// the copy.
struct StoredCopy {
  StoredSide view;
  std::shared_ptr<const void> keep;
};
StoredCopy stored_copy(const SideStore& s);

/// \brief Backend cpu's quantizers for make_side (kernels/cpu/): they store the reference's bytes,
/// bit for bit, faster. The model's cache, the Python Cache and the throughput sweep use them.
SideKernels cpu_side_kernels();
/// \brief The quantizers `b`'s caches are built with: the reference's for ref, else cpu's.
SideKernels side_kernels(AttentionBackend b);
/// \brief The space the exact tails of a causal call on `b` are gathered in (gather_exact_tail):
/// backends cpu and cuda read them as stored (rot= sides: rotated), backend ref in the model's
/// space.
TailSpace tail_space(AttentionBackend b);

/// \brief What cpu_causal_input keeps alive for the call: quantized token counts, and the query
/// rotated into a rot= key side's space.
struct CpuCausalBuffers {
  std::vector<int64_t> kq, vq;
  std::vector<float> q;
};

/// \brief Backend cpu's causal call for positions t_begin .. t_begin + n - 1 (q [n, q_heads, dim])
/// over the sides as stored (holding t_begin + n tokens) and their exact tails as stored
/// (gather_exact_tail with TailSpace::kStored: a rot= side's rows rotated). A rot= key side gets q
/// rotated; the call's output is then in a rot= value side's space: unrotate_output. CausalCall
/// and attend_causal wrap it; the kernels' tests call it directly.
cpu::CausalInput cpu_causal_input(const float* q, int64_t n, int64_t q_heads, int64_t t_begin,
                                  const SideStore& k, const SideStore& v, ExactTail k_exact,
                                  ExactTail v_exact, CpuCausalBuffers& b);

/// \brief out [rows, dim] of a backend cpu call rotated back by v's rot= (nothing without one).
void unrotate_output(const SideStore& v, float* out, int64_t rows);

/// \brief Decode attention of q [q_heads, dim] (the model's space, host memory) over every token
/// of k and v, out [q_heads, dim] (the model's space, host memory): backend ref's
/// decode_attention, or the kernels of cpu / cpu-int8 / cuda with q rotated into a rot= key
/// side's space and the output rotated back from a rot= value side's. Backend cuda takes sides from
/// make_backend_side(cuda, ...) (q uploaded, the CUDA decode kernel, out downloaded); the host
/// backends take host sides. working_set: cpu::DecodeOptions::working_set. Throws
/// require_supported's error for a scheme or shape the backend does not run.
void attend_decode(AttentionBackend b, const float* q, int64_t q_heads, const SideStore& k,
                   const SideStore& v, float* out, int threads = 1, double working_set = 0);

/// \brief Backend cuda with rows in DEVICE memory (the model's decode step, model/llama_cuda.cpp):
/// append_device appends n tokens x [n, heads, dim] to a side from make_backend_side(cuda, ...);
/// attend_decode_device is attend_decode(cuda, ...) with q and out [q_heads, dim] in device
/// memory. Neither copies to or from the host, except over a rot= side (rotated on the host):
/// there the rows / q come back, take the host call, and the output goes up again.
void append_device(SideStore& s, const float* x, int64_t n);
void attend_decode_device(const float* q, int64_t q_heads, const SideStore& k, const SideStore& v,
                          float* out);

/// \brief Backend cuda's serving step (model/llama_cuda.cpp's decode_batch), rows in DEVICE
/// memory: append_device_batch appends n tokens x[i] [n, heads, dim] to sides[i] for every i
/// (cuda::DeviceSide::append_batch: one batched append for int and bf16 sides); sides of one
/// scheme and shape from make_backend_side(cuda, ...). attend_decode_device_batch is
/// attend_decode_device for B sequences in one call: q and out [B, q_heads, dim], sequence b over
/// (k[b], v[b]), one decode launch per kMaxBatch sequences. rot= sides take the single-sequence
/// path one side / sequence at a time (their rotation runs on the host).
void append_device_batch(std::span<SideStore* const> sides, std::span<const float* const> x,
                         int64_t n);
void attend_decode_device_batch(const float* q, int64_t q_heads,
                                std::span<const SideStore* const> k,
                                std::span<const SideStore* const> v, float* out);
/// \brief What position `pos` of a causal call reads from side `s`, as one StoredSide: `stored`
/// (s's bytes after the call's append, host or device pointers) cut to its first pos + 1 tokens,
/// the first s.quantized_tokens_at(pos + 1) of them from the codes (a prefix: the codes of earlier
/// tokens never change) and the rest exact from `tail` (rows of tokens tail_begin on, e.g.
/// gather_exact_tail's). The view a decode over a side holding pos + 1 tokens reads, so one decode
/// launch over the n views of positions t_begin .. t_begin + n - 1 is a causal call (backend
/// cuda's). Pointer arithmetic only, nothing dereferenced. Throws kvq::Error for a position the
/// side does not hold, a tail that starts after the position's codes end, sinks (sink=S), and a
/// non-int side that keeps tokens exact beyond its codes (fp8 first=N: backend cuda reads none).
StoredSide causal_position_view(const SideStore& s, const StoredSide& stored, int64_t pos,
                                const float* tail, int64_t tail_begin);

/// \brief Backend cuda's prefill step with rows in DEVICE memory (model/llama_cuda.cpp's chunked
/// prefill): appends the n rows xk and xv (row r at x + r * stride floats, [heads, dim] each) to
/// k and v (sides from make_backend_side(cuda, ...) holding t_begin tokens each), then out
/// [n, q_heads, dim] = causal attention of q [n, q_heads, dim] (contiguous) at positions t_begin
/// .. t_begin + n - 1: the exact tails gathered on the device (cuda::DeviceSide::
/// exact_tail_device), one decode launch per kMaxBatch positions over causal_position_view's
/// views. The same bytes as n append_device steps, and the outputs those steps'
/// attend_decode_device give up to float32 summation order (a launch splits its longest context,
/// and a chunk's is longer). Nothing crosses to the host except over a rot= side (rotated on the
/// host, as attend_decode_device): there rows, q and output cross and the host path runs.
void prefill_device(SideStore& k, SideStore& v, const float* xk, const float* xv, int64_t stride,
                    int64_t n, const float* q, int64_t q_heads, float* out);

/// \brief Device memory in use on `b`'s GPU now (cudaMemGetInfo: total - free, every process's
/// allocations and the CUDA context included); throws for a host backend or without a device.
int64_t device_memory_used(AttentionBackend b);

/// \brief What a [throughput] row records about backend cuda's GPU (cudaGetDeviceProperties).
struct DeviceReport {
  std::string name;
  int driver_version = 0, runtime_version = 0;  ///< e.g. 13000 for 13.0
  double peak_gbps = 0;      ///< memory clock x bus width x 2 (double data rate), in GB/s
  std::string peak_formula;  ///< how peak_gbps was computed, with the numbers
  int64_t memory_bytes = 0;
};
/// \brief The GPU backend `b` runs on; throws for a host backend or cuda_unavailable()'s line.
DeviceReport device_report(AttentionBackend b);

/// \brief Timed decode steps on a device backend (cuda) for the [throughput] task: step r reads
/// sequences (r * batch + i) mod pool for i < batch, sides k_pool[j] and v_pool[j] from
/// make_backend_side(b, ...), every sequence with the same q [q_heads, dim] (host; rotated for a
/// rot= key side), q and out in device memory, one launch per 64 sequences. One warm-up step, then
/// `repeats` steps each between CUDA events; returns the median microseconds. The output's
/// rotation back (rot=) is not timed.
double time_device_decode_us(AttentionBackend b, std::span<const SideStore* const> k_pool,
                             std::span<const SideStore* const> v_pool, int64_t batch,
                             const float* q, int64_t q_heads, int repeats);
/// \brief Device-to-device copy bandwidth on `b`'s GPU of a `bytes`-byte buffer, GB/s (10^9 bytes
/// copied per second; DRAM moves twice that), the median of `repeats` timed by CUDA events.
double device_copy_gbps(AttentionBackend b, double bytes, int repeats);

/// \brief A causal call: positions t_begin .. t_begin + n - 1, q [n, q_heads, dim] in the model's
/// space, over sides holding t_begin + n tokens and their exact tails gathered in
/// tail_space(backend) (reference_cpu/attention.h's causal_attention contract), in host memory.
struct CausalArgs {
  const float* q = nullptr;
  int64_t n = 0, q_heads = 0, t_begin = 0;
  const SideStore* k = nullptr;
  const SideStore* v = nullptr;
  ExactTail k_exact, v_exact;
  /// > 0: a sliding window, position i attends to tokens i - window + 1 .. i only (backends ref
  /// and cpu; cpu runs the positions past the window on its portable path, and not with sinks).
  int64_t window = 0;
};

/// \brief One causal call split into work items any thread runs (each item once, any order, one
/// Workspace per thread), then every merge, then finish on the output's rows: the model's
/// team-parallel form. Backend ref's items are (position, kv head) pairs and it has no merges;
/// backend cpu's are cpu::CausalAttention's. The constructor checks the arguments
/// (causal_attention_check) and refuses backend cuda, whose causal call is one device call
/// (attend_causal, prefill_device), not host work items.
class CausalCall {
 public:
  struct Workspace {
    cpu::CausalAttention::Workspace cpu;
    std::vector<float> scratch;  // backend ref
  };
  CausalCall(AttentionBackend b, const CausalArgs& a, int threads, double working_set = 0);
  int64_t items() const;
  int64_t merges() const;
  void run(int64_t item, float* out, Workspace& w);
  void merge(int64_t m, float* out);
  /// \brief Whether finish changes anything (a rot= value side on backend cpu).
  bool rotates_output() const;
  /// \brief out rows [rows, dim] rotated back from a rot= value side's space (backend cpu).
  void finish(float* out, int64_t rows) const;

 private:
  AttentionBackend b_;
  CausalArgs a_;
  CpuCausalBuffers buf_;  // backend cpu: token counts, q rotated for a rot= key side
  std::unique_ptr<cpu::CausalAttention> cpu_;
};

/// \brief The whole causal call on `threads` threads, out [n, q_heads, dim] in the model's space.
/// Backend cuda (sides from make_backend_side(cuda, ...), tails in tail_space(cuda)): q and the
/// tails uploaded, one decode launch per kMaxBatch positions over causal_position_view's views,
/// out downloaded (prefill_device's attention with host rows); `threads` unused.
void attend_causal(AttentionBackend b, const CausalArgs& a, float* out, int threads = 1);

}  // namespace kvq
