// The backend interface (issue 47, item 1; first step): one list of the attention backends' names
// (ref, cpu, cpu-int8, cuda) with one parser, what each supports declared once, and the attention
// calls over a cache side pair (decode and causal) with the rot= rotation handled once. The model,
// `kvq run`, the benches and Python choose and call a backend through here only. Sinks (sink=S)
// travel inside the sides (StoredSide::sink) and every backend reads them there.
//
// Layer: above the backends (reference_cpu/, kernels/cpu/, kernels/cuda/), below model/
// (scripts/check-layers.py).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/attention.h"
#include "reference_cpu/kv_cache.h"

namespace kvq {

/// \brief Which backend computes attention over the cache (all read the same stored bytes).
enum class AttentionBackend {
  kRef,  ///< reference_cpu/attention.h: the scalar definition
  kCpu,  ///< kernels/cpu/attention.h: SIMD kernels, threads over positions and context segments
  /// The same kernels in their int8 mode (cpu::IntMode::Int8: integer dot products on 2/4-bit
  /// codes, bf16 dot products on FP8 codes, with the rounding error kernels/cpu/attention.h
  /// states); other caches as kCpu.
  kCpuInt8,
  /// kernels/cuda/: known by name; today only its own tests and benches run it (kCudaToday).
  kCuda,
};

/// \brief One backend as every caller sees it: the one list is backends().
struct BackendInfo {
  AttentionBackend id;
  const char* name;  ///< the flag's, the config's and Python's spelling
  const char* what;  ///< one phrase for --help and the parse error
  /// Attention over a SideStore pair in this process (attend_decode, CausalCall): the model,
  /// Python's Cache and the [throughput] task. False for cuda today.
  bool host;
  cpu::IntMode int_mode;  ///< backend cpu's mode (kCpu: Exact, kCpuInt8: Int8)
};

/// \brief What reaches backend cuda today: the one line every refusal of it prints.
inline constexpr const char* kCudaToday =
    "backend cuda runs today in the CUDA kernels' own tests and benches (tests/kernels/cuda/, "
    "bench_attention_cuda, bench_kivi_cuda; scripts/device-check.sh runs them on a GPU); the "
    "model, Python and the [throughput] task do not reach it yet (issue 47)";

/// \brief The one list, in the order --help and errors name them.
std::span<const BackendInfo> backends();
const BackendInfo& backend_info(AttentionBackend b);
/// \brief "ref" / "cpu" / "cpu-int8" / "cuda".
const char* to_string(AttentionBackend b);
/// \brief The names joined by `sep` ("ref, cpu, cpu-int8, cuda"); host_only: those with .host.
std::string backend_names(std::string_view sep = ", ", bool host_only = false);
/// \brief Throws kvq::Error "unknown backend 'S' (choices: ref, the scalar reference; ...)".
AttentionBackend parse_backend(std::string_view s);
/// \brief Throws kvq::Error with kCudaToday unless `b` runs attention here (BackendInfo::host).
void require_host(AttentionBackend b);

/// \brief Backend cpu's quantizers for make_side (kernels/cpu/): they store the reference's bytes,
/// bit for bit, faster. The model's cache, the Python Cache and the throughput sweep use them.
SideKernels cpu_side_kernels();
/// \brief The quantizers `b`'s caches are built with: the reference's for ref, else cpu's.
SideKernels side_kernels(AttentionBackend b);
/// \brief The space the exact tails of a causal call on `b` are gathered in (gather_exact_tail):
/// backend cpu reads them as stored (rot= sides: rotated), backend ref in the model's space.
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

/// \brief Decode attention of q [q_heads, dim] (the model's space) over every token of k and v,
/// out [q_heads, dim] (the model's space): backend ref's decode_attention, or backend cpu's with
/// q rotated into a rot= key side's space and the output rotated back from a rot= value side's.
/// working_set: cpu::DecodeOptions::working_set. Throws for a backend that is not host.
void attend_decode(AttentionBackend b, const float* q, int64_t q_heads, const SideStore& k,
                   const SideStore& v, float* out, int threads = 1, double working_set = 0);

/// \brief A causal call: positions t_begin .. t_begin + n - 1, q [n, q_heads, dim] in the model's
/// space, over sides holding t_begin + n tokens and their exact tails gathered in
/// tail_space(backend) (reference_cpu/attention.h's causal_attention contract).
struct CausalArgs {
  const float* q = nullptr;
  int64_t n = 0, q_heads = 0, t_begin = 0;
  const SideStore* k = nullptr;
  const SideStore* v = nullptr;
  ExactTail k_exact, v_exact;
  /// > 0: a sliding window, position i attends to tokens i - window + 1 .. i only (backend ref;
  /// backend cpu refuses a call in which some position reaches past its window).
  int64_t window = 0;
};

/// \brief One causal call split into work items any thread runs (each item once, any order, one
/// Workspace per thread), then every merge, then finish on the output's rows: the model's
/// team-parallel form. Backend ref's items are (position, kv head) pairs and it has no merges;
/// backend cpu's are cpu::CausalAttention's. The constructor checks the arguments
/// (causal_attention_check) and throws for a backend that is not host.
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
void attend_causal(AttentionBackend b, const CausalArgs& a, float* out, int threads = 1);

}  // namespace kvq
