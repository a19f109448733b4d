#include "kernels/backend.h"

#include <fmt/format.h>

#include <array>

#include "core/error.h"
#include "core/rotation.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/kivi.h"
#include "reference_cpu/attention.h"

namespace kvq {

namespace {

constexpr std::array<BackendInfo, 4> kBackends{{
    {AttentionBackend::kRef, "ref", "the scalar reference", true, cpu::IntMode::Exact},
    {AttentionBackend::kCpu, "cpu", "the SIMD kernels", true, cpu::IntMode::Exact},
    {AttentionBackend::kCpuInt8, "cpu-int8",
     "the SIMD kernels' reduced-precision dot products on 2/4-bit and FP8 codes", true,
     cpu::IntMode::Int8},
    {AttentionBackend::kCuda, "cuda", "the CUDA kernels (their own tests and benches today)", false,
     cpu::IntMode::Exact},
}};

}  // namespace

std::span<const BackendInfo> backends() { return kBackends; }

const BackendInfo& backend_info(AttentionBackend b) {
  for (const BackendInfo& i : kBackends)
    if (i.id == b) return i;
  fail("backend {} is not in the list of backends", static_cast<int>(b));
}

const char* to_string(AttentionBackend b) { return backend_info(b).name; }

std::string backend_names(std::string_view sep, bool host_only) {
  std::string out;
  for (const BackendInfo& i : kBackends) {
    if (host_only && !i.host) continue;
    if (!out.empty()) out += sep;
    out += i.name;
  }
  return out;
}

AttentionBackend parse_backend(std::string_view s) {
  for (const BackendInfo& i : kBackends)
    if (s == i.name) return i.id;
  std::string choices;
  for (const BackendInfo& i : kBackends)
    choices += fmt::format("{}{}, {}", choices.empty() ? "" : "; ", i.name, i.what);
  fail("unknown backend '{}' (choices: {})", s, choices);
}

void require_host(AttentionBackend b) {
  if (!backend_info(b).host) fail("{}", kCudaToday);
}

SideKernels cpu_side_kernels() {
  SideKernels k;
  k.kivi = cpu::kivi_group_quantizers();
  k.fp8_scales = cpu::fp8_compute_scales;
  k.fp8_quantize = cpu::fp8_quantize;
  return k;
}

SideKernels side_kernels(AttentionBackend b) {
  return b == AttentionBackend::kRef ? SideKernels{} : cpu_side_kernels();
}

TailSpace tail_space(AttentionBackend b) {
  return b == AttentionBackend::kRef ? TailSpace::kModel : TailSpace::kStored;
}

cpu::CausalInput cpu_causal_input(const float* q, int64_t n, int64_t q_heads, int64_t t_begin,
                                  const SideStore& k, const SideStore& v, ExactTail k_exact,
                                  ExactTail v_exact, CpuCausalBuffers& b) {
  b.kq.resize(static_cast<size_t>(n));
  b.vq.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    b.kq[static_cast<size_t>(i)] = k.quantized_tokens_at(t_begin + i + 1);
    b.vq[static_cast<size_t>(i)] = v.quantized_tokens_at(t_begin + i + 1);
  }
  cpu::CausalInput in;
  in.q = q;
  in.n = n;
  in.q_heads = q_heads;
  in.t_begin = t_begin;
  in.k = k.stored();
  in.v = v.stored();
  in.k_exact = k_exact;
  in.v_exact = v_exact;
  in.k_quantized = b.kq;
  in.v_quantized = b.vq;
  // rot=: the kernels read the rotated codes (and the tails as stored), so q is rotated too.
  if (const Rotation* r = k.rotation()) {
    b.q.assign(q, q + n * q_heads * k.dim());
    r->rotate(b.q.data(), n * q_heads);
    in.q = b.q.data();
  }
  return in;
}

void unrotate_output(const SideStore& v, float* out, int64_t rows) {
  if (const Rotation* r = v.rotation()) r->unrotate(out, rows);
}

void attend_decode(AttentionBackend b, const float* q, int64_t q_heads, const SideStore& k,
                   const SideStore& v, float* out, int threads, double working_set) {
  require_host(b);
  if (b == AttentionBackend::kRef) {
    decode_attention(q, q_heads, k, v, out, threads);
    return;
  }
  // a rot= side reads a rotated query and gives a rotated output
  std::vector<float> qr;
  if (const Rotation* r = k.rotation()) {
    qr.assign(q, q + q_heads * k.dim());
    r->rotate(qr.data(), q_heads);
    q = qr.data();
  }
  const cpu::DecodeOptions opt{threads, backend_info(b).int_mode, working_set};
  cpu::decode_attention(q, q_heads, k.stored(), v.stored(), out, opt);
  unrotate_output(v, out, q_heads);
}

namespace {
// A sliding window is backend ref's alone today: refuse a call it would change.
void check_window(AttentionBackend b, const CausalArgs& a) {
  KVQ_CHECK(b == AttentionBackend::kRef || a.window <= 0 || a.t_begin + a.n <= a.window,
            "backend {} has no sliding-window attention: this layer's window is {} tokens and "
            "the cache holds {}; use backend ref (or at most {} tokens)",
            to_string(b), a.window, a.t_begin + a.n, a.window);
}
}  // namespace

CausalCall::CausalCall(AttentionBackend b, const CausalArgs& a, int threads, double working_set)
    : b_(b), a_(a) {
  require_host(b);
  check_window(b, a);
  KVQ_CHECK(a.k && a.v, "causal attention: no sides given");
  causal_attention_check(a.n, a.q_heads, a.t_begin, *a.k, *a.v, a.k_exact, a.v_exact);
  if (b == AttentionBackend::kRef) return;
  cpu::CausalInput in =
      cpu_causal_input(a.q, a.n, a.q_heads, a.t_begin, *a.k, *a.v, a.k_exact, a.v_exact, buf_);
  in.int_mode = backend_info(b).int_mode;
  in.working_set = working_set;
  cpu_ = std::make_unique<cpu::CausalAttention>(in, threads);
}

int64_t CausalCall::items() const { return cpu_ ? cpu_->items() : a_.n * a_.k->heads(); }

int64_t CausalCall::merges() const { return cpu_ ? cpu_->merges() : 0; }

void CausalCall::run(int64_t item, float* out, Workspace& w) {
  if (cpu_)
    cpu_->run(item, out, w.cpu);
  else
    causal_attention_item(a_.q, a_.q_heads, a_.t_begin, *a_.k, *a_.v, a_.k_exact, a_.v_exact, out,
                          item, w.scratch, a_.window);
}

void CausalCall::merge(int64_t m, float* out) {
  if (cpu_) cpu_->merge(m, out);
}

bool CausalCall::rotates_output() const { return cpu_ && a_.v->rotation(); }

void CausalCall::finish(float* out, int64_t rows) const {
  if (cpu_) unrotate_output(*a_.v, out, rows);
}

void attend_causal(AttentionBackend b, const CausalArgs& a, float* out, int threads) {
  require_host(b);
  check_window(b, a);
  KVQ_CHECK(a.k && a.v, "causal attention: no sides given");
  if (b == AttentionBackend::kRef) {
    causal_attention(a.q, a.n, a.q_heads, a.t_begin, *a.k, *a.v, a.k_exact, a.v_exact, out,
                     threads, a.window);
    return;
  }
  causal_attention_check(a.n, a.q_heads, a.t_begin, *a.k, *a.v, a.k_exact, a.v_exact);
  CpuCausalBuffers buf;
  cpu::CausalInput in =
      cpu_causal_input(a.q, a.n, a.q_heads, a.t_begin, *a.k, *a.v, a.k_exact, a.v_exact, buf);
  in.int_mode = backend_info(b).int_mode;
  cpu::causal_attention(in, out, threads);
  unrotate_output(*a.v, out, a.n * a.q_heads);
}

}  // namespace kvq
