#include "kernels/backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <utility>

#include "core/error.h"
#include "core/rotation.h"
#include "core/schemes.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/kivi.h"
#include "kernels/cuda/dispatch.h"
#if KVQ_HAVE_CUDA
#include "kernels/cuda/device_side.h"
#endif
#include "reference_cpu/attention.h"

namespace kvq {

namespace {

// Backend cuda's limits as the CUDA kernels are compiled (kernels/cuda/dispatch.h, the one place
// they are written down).
constexpr BackendSupport cuda_support() {
  BackendSupport s;
  s.fp32 = false;
  s.fp16 = false;
  s.fp8_prefix_scales = false;
  s.int_fp16_arith = false;
  s.sink = false;
  s.mixed_sides = false;
  s.pre_rope = false;  // the model runs (model/llama_cuda.cpp: chunked prefill, decode steps)
  s.head_dims = cuda::HeadDims::values;
  s.bits = cuda::BitWidths::values;
  s.max_gqa = cuda::kMaxGqa;
  s.max_batch = cuda::kMaxBatch;
  return s;
}

constexpr std::array<BackendInfo, 4> kBackends{{
    {AttentionBackend::kRef, "ref", "the scalar reference", true, {}},
    {AttentionBackend::kCpu, "cpu", "the SIMD kernels", true, {}},
    {AttentionBackend::kCpuInt8,
     "cpu-int8",
     "the SIMD kernels' reduced-precision dot products on 2/4-bit and FP8 codes",
     true,
     {}},
    {AttentionBackend::kCuda, "cuda",
     "the CUDA kernels (decode and causal attention, and the model on a GPU)", false,
     cuda_support()},
}};

// Backend cpu's mode: the backend's name carries it (cpu-int8), nothing above this file names it.
cpu::IntMode int_mode(AttentionBackend b) {
  return b == AttentionBackend::kCpuInt8 ? cpu::IntMode::Int8 : cpu::IntMode::Exact;
}

std::string join(std::span<const int> v) { return fmt::format("{}", fmt::join(v, ", ")); }

// Why `sup` does not store one side's scheme `s` (no per-layer, no split), or "".
std::string side_unsupported(const BackendSupport& sup, const SchemeSpec& s) {
  if (!sup.reads(s.kind())) return fmt::format("{} caches", kind_label(s.kind()));
  // The options of a kind a backend reads only in part.
  if (s.kind() == SchemeKind::Fp8 && !sup.fp8_prefix_scales &&
      s.fp8().source == ScaleSource::Dynamic && s.fp8().gran != Granularity::Token)
    return "dynamic fp8 scales per tensor, head or channel (first=N keeps the first tokens "
           "exact); use gran=token or a constant or calib scale";
  if (s.kind() == SchemeKind::Int) {
    if (!sup.int_fp16_arith && s.q().arith != Arith::Exact)
      return "arith=fp16 (KIVI's reference arithmetic)";
    if (!sup.bits.empty() &&
        std::find(sup.bits.begin(), sup.bits.end(), s.q().bits) == sup.bits.end())
      return fmt::format("{}-bit codes (bits: {})", s.q().bits, join(sup.bits));
  }
  if (!sup.rot && s.rot.on) return "rot=hadamard";
  if (!sup.sink && s.sink > 0) return "sink=S (exact sink tokens)";
  return "";
}

}  // namespace

const char* to_string(AttentionOp op) {
  return op == AttentionOp::kDecode ? "decode attention" : "causal attention (prefill)";
}

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

std::string unsupported(AttentionBackend b, const SchemeSpec& spec, AttentionOp op) {
  const BackendSupport& sup = backend_info(b).support;
  if (op == AttentionOp::kDecode && !sup.decode) return "decode attention";
  if (op == AttentionOp::kCausal && !sup.causal)
    return "causal attention (prefill, and the model's steps)";
  for (const SchemeSpec& l : spec.distinct_layer_specs()) {
    for (const Role r : {Role::Key, Role::Value})
      if (std::string why = side_unsupported(sup, l.side(r)); !why.empty()) return why;
    const SchemeSpec &k = l.side(Role::Key), &v = l.side(Role::Value);
    if (!sup.mixed_sides &&
        (k.kind() != v.kind() || (k.kind() == SchemeKind::Int && k.q().bits != v.q().bits) ||
         (k.kind() == SchemeKind::Fp8 && k.fp8().format != v.fp8().format)))
      return "keys and values of different kinds, bits or fp8 formats";
  }
  return "";
}

std::string unsupported_shape(AttentionBackend b, int64_t heads, int64_t dim, int64_t q_heads,
                              int64_t batch) {
  const BackendSupport& sup = backend_info(b).support;
  if (heads < 1 || dim < 1 || q_heads < 1 || q_heads % heads != 0)
    return fmt::format(
        "{} query heads over {} kv heads of head_dim {} (query heads must be a "
        "positive multiple of the kv heads)",
        q_heads, heads, dim);
  if (!sup.head_dims.empty() &&
      std::find(sup.head_dims.begin(), sup.head_dims.end(), dim) == sup.head_dims.end())
    return fmt::format("head_dim {} (head_dim: {})", dim, join(sup.head_dims));
  if (sup.max_gqa > 0 && q_heads / heads > sup.max_gqa)
    return fmt::format("{} query heads per kv head (at most {})", q_heads / heads, sup.max_gqa);
  (void)batch;  // a launch takes at most max_batch sequences; more are split into launches
  return "";
}

std::string backends_for(const SchemeSpec& spec, AttentionOp op) {
  std::string out;
  for (const BackendInfo& i : kBackends)
    if (unsupported(i.id, spec, op).empty())
      out += fmt::format("{}{}", out.empty() ? "" : ", ", i.name);
  return out.empty() ? "none" : out;
}

void require_supported(AttentionBackend b, const SchemeSpec& spec, AttentionOp op) {
  const std::string why = unsupported(b, spec, op);
  if (why.empty()) return;
  fail("backend {} cannot run {} over '{}': it does not run {} (backends that can: {})",
       to_string(b), to_string(op), spec.canonical(), why, backends_for(spec, op));
}

namespace {
std::string model_backends() {
  std::string out;
  for (const BackendInfo& i : kBackends)
    if (i.support.model) out += fmt::format("{}{}", out.empty() ? "" : ", ", i.name);
  return out;
}
}  // namespace

void require_model(AttentionBackend b) {
  if (backend_info(b).support.model) return;
  fail(
      "backend {} does not run the model yet: its cache lives in device memory and it runs decode "
      "attention only (kvq run's [throughput] task, Python's kvq.Cache); backends that run the "
      "model: {}",
      to_string(b), model_backends());
}

std::string model_unsupported(AttentionBackend b, const SchemeSpec& spec, bool pre_rope) {
  const BackendSupport& sup = backend_info(b).support;
  if (!sup.model) return "the model";
  if (pre_rope && !sup.pre_rope) return "pre_rope (pre-RoPE keys)";
  // the model's attention on b: its causal calls where it runs them, else decode steps
  return unsupported(b, spec, sup.causal ? AttentionOp::kCausal : AttentionOp::kDecode);
}

void require_model(AttentionBackend b, const SchemeSpec& spec, bool pre_rope) {
  const std::string why = model_unsupported(b, spec, pre_rope);
  if (why.empty()) return;
  std::string can;
  for (const BackendInfo& i : kBackends)
    if (model_unsupported(i.id, spec, pre_rope).empty())
      can += fmt::format("{}{}", can.empty() ? "" : ", ", i.name);
  fail(
      "backend {} cannot run the model with the cache '{}'{}: it does not run {} (backends that "
      "can: {})",
      to_string(b), spec.canonical(), pre_rope ? " and pre_rope" : "", why,
      can.empty() ? "none" : can);
}

SchemeSpec reference_spec(AttentionBackend b) {
  return parse_spec(backend_info(b).support.fp32 ? "fp32" : "bf16");
}

void require_available(AttentionBackend b) {
  if (b != AttentionBackend::kCuda) return;
  if (const std::string why = cuda_unavailable(); !why.empty()) fail("{}", why);
}

void require_host(AttentionBackend b) {
  if (backend_info(b).host) return;
  require_model(b);  // the host-only callers are the model's: say it in its words
  fail(
      "backend {} keeps its cache in device memory, and this reads host caches (kvq model dump / "
      "calibrate, a cache's dequantize; backends with host caches: {})",
      to_string(b), backend_names(", ", true));
}

std::string cuda_unavailable() {
#if KVQ_HAVE_CUDA
  return cuda::no_device_reason();
#else
  return "backend cuda: this kvq was built without CUDA (configure with nvcc present or "
         "-DKVQ_CUDA=ON; the Python package: pip install . -C cmake.define.KVQ_CUDA=ON)";
#endif
}

std::string support_help() {
  std::string out;
  for (const BackendInfo& i : kBackends) {
    const BackendSupport& s = i.support;
    std::string runs = s.causal ? "decode and causal attention" : "decode attention";
    std::vector<std::string> kinds;
    for (const SchemeKind k : scheme_kinds())
      if (s.reads(k)) kinds.push_back(std::string(kind_label(k)));
    std::vector<std::string> no;
    if (!s.fp8_prefix_scales) no.push_back("fp8 dynamic tensor/head/channel scales");
    if (!s.int_fp16_arith) no.push_back("arith=fp16");
    if (!s.sink) no.push_back("sink=");
    if (!s.rot) no.push_back("rot=");
    if (!s.mixed_sides) no.push_back("k/v of different kinds");
    if (!s.model)
      no.push_back("the model");
    else if (!s.pre_rope)
      no.push_back("pre_rope");
    std::string limits;
    if (!s.head_dims.empty()) limits += fmt::format("; head_dim {}", join(s.head_dims));
    if (!s.bits.empty()) limits += fmt::format("; bits {}", join(s.bits));
    if (s.max_gqa > 0) limits += fmt::format("; GQA <= {}", s.max_gqa);
    if (s.max_batch > 0) limits += fmt::format("; {} sequences a launch", s.max_batch);
    out += fmt::format("  {}: {}; {} over {}{}{}\n", i.name, i.what, runs, fmt::join(kinds, ", "),
                       limits, no.empty() ? "" : fmt::format("; not: {}", fmt::join(no, ", ")));
  }
  return out;
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

StoredSide causal_position_view(const SideStore& s, const StoredSide& stored, int64_t pos,
                                const float* tail, int64_t tail_begin) {
  const int64_t t = pos + 1;
  KVQ_CHECK(pos >= 0 && t <= stored.tokens,
            "causal attention: position {} of a side holding {} tokens", pos, stored.tokens);
  KVQ_CHECK(stored.sink_tokens == 0,
            "causal attention: a side with sink=S has no per-position view (the host backends' "
            "causal calls read sinks)");
  StoredSide v = stored;
  v.tokens = t;
  const int64_t q = s.quantized_tokens_at(t);
  if (stored.kind == SchemeKind::Int) {
    KVQ_CHECK(
        q <= stored.quantized_tokens && tail_begin <= q && (tail || q == t),
        "causal attention: position {} reads codes of tokens [0, {}) and exact rows [{}, {}), "
        "but the side holds codes of {} tokens and the exact tail starts at {}{}",
        pos, q, q, t, stored.quantized_tokens, tail_begin, tail ? "" : " (no tail given)");
    v.quantized_tokens = q;
    v.residual = q < t ? tail + (q - tail_begin) * stored.heads * stored.dim : nullptr;
  } else {
    KVQ_CHECK(q == t,
              "causal attention: this {} side keeps tokens [{}, {}) exact beside its codes (fp8 "
              "first=N); no per-position view reads them",
              kind_label(stored.kind), q, t);
  }
  return v;
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

namespace {

// Causal calls run on the host backends only (the table's `causal`); the sides must be host ones.
void require_causal(AttentionBackend b, const CausalArgs& a) {
  KVQ_CHECK(a.k && a.v, "causal attention: no sides given");
  if (!backend_info(b).support.causal)
    fail("backend {} does not run {} (backends that do: {})", to_string(b),
         to_string(AttentionOp::kCausal), [] {
           std::string out;
           for (const BackendInfo& i : kBackends)
             if (i.support.causal) out += fmt::format("{}{}", out.empty() ? "" : ", ", i.name);
           return out;
         }());
}

#if KVQ_HAVE_CUDA
// Backend cuda's side: the bytes in device memory (kernels/cuda/device_side.h); rot= rotates the
// appended rows on the host first. Host reads (dequantize, stored) refuse.
class CudaSide final : public SideStore {
 public:
  CudaSide(const SchemeSpec& spec, Role role, int64_t heads, int64_t dim, int layer)
      : dev_(spec.base(), role, heads, dim, layer) {
    if (spec.rot.on) rot_ = std::make_unique<Rotation>(spec.rot, dim);
  }
  void append(const float* x, int64_t n) override {
    if (rot_) {
      buf_.assign(x, x + n * heads() * dim());
      rot_->rotate(buf_.data(), n * heads());
      x = buf_.data();
    }
    dev_.append(x, n);
  }
  void reserve(int64_t t) override { dev_.reserve(t); }
  int64_t tokens() const override { return dev_.tokens(); }
  int64_t heads() const override { return dev_.heads(); }
  int64_t dim() const override { return dev_.dim(); }
  int64_t quantized_tokens_at(int64_t t) const override { return dev_.quantized_tokens_at(t); }
  void exact_tail(std::vector<float>& out) const override {
    const size_t before = out.size();
    dev_.exact_tail(out);
    if (rot_)
      rot_->unrotate(out.data() + before, static_cast<int64_t>(out.size() - before) / dim());
  }
  void stored_exact_tail(std::vector<float>& out) const override { dev_.exact_tail(out); }
  Tensor3 dequantize() const override { host_read("dequantize"); }
  Footprint footprint() const override { return dev_.footprint(); }
  StoredSide stored() const override { host_read("stored"); }
  const Rotation* rotation() const override { return rot_.get(); }
  const cuda::DeviceSide& device() const { return dev_; }
  cuda::DeviceSide& device_mut() { return dev_; }
  // x in device memory; a rot= side reads the rows back and rotates them as append does
  void append_device(const float* x, int64_t n) {
    if (!rot_) {
      dev_.append_device(x, n);
      return;
    }
    std::vector<float> h(static_cast<size_t>(n * heads() * dim()));
    cuda::download_floats(x, static_cast<int64_t>(h.size()), h.data());
    append(h.data(), n);
  }

 private:
  [[noreturn]] static void host_read(const char* what) {
    fail(
        "backend cuda's cache side keeps its bytes in device memory: {} reads host bytes (attend "
        "with backend cuda, or read them back with stored_copy)",
        what);
  }
  cuda::DeviceSide dev_;
  std::unique_ptr<Rotation> rot_;
  std::vector<float> buf_;
};

const CudaSide& cuda_side(const SideStore& s, const char* which) {
  const auto* c = dynamic_cast<const CudaSide*>(&s);
  KVQ_CHECK(c,
            "backend cuda reads sides made by make_backend_side(cuda, ...); the {} side is a host "
            "side",
            which);
  return *c;
}

// This thread's decoder (its workspace grows to the largest launch and stays).
cuda::DeviceDecoder& thread_decoder() {
  thread_local cuda::DeviceDecoder decoder;
  return decoder;
}

// q and out in host memory (on_host) or device memory.
void cuda_decode(const SideStore& k, const SideStore& v, const float* q, int64_t q_heads,
                 float* out, bool on_host) {
  const StoredSide kv = cuda_side(k, "key").device().device_view(),
                   vv = cuda_side(v, "value").device().device_view();
  cuda::DeviceDecoder& decoder = thread_decoder();
  if (on_host) {
    decoder.run_host(kv, vv, q_heads, q, out);
  } else {
    decoder.run(std::span<const StoredSide>(&kv, 1), std::span<const StoredSide>(&vv, 1), q_heads,
                q, out);
  }
}

// Causal attention over device sides k and v holding t_begin + n tokens: q and out
// [n, q_heads, dim] and the exact tails (rows of tokens k_begin / v_begin on) in device memory.
// The n positions are n sequences of one decode launch (per kMaxBatch) over one side pair, each
// reading its own prefix of the codes and its own rows of the tail (causal_position_view).
void cuda_causal(const SideStore& k, const SideStore& v, int64_t t_begin, int64_t n,
                 int64_t q_heads, const float* q, const float* k_tail, int64_t k_begin,
                 const float* v_tail, int64_t v_begin, float* out) {
  const StoredSide ks = cuda_side(k, "key").device().device_view(),
                   vs = cuda_side(v, "value").device().device_view();
  std::vector<StoredSide> kv, vv;
  kv.reserve(static_cast<size_t>(n));
  vv.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    kv.push_back(causal_position_view(k, ks, t_begin + i, k_tail, k_begin));
    vv.push_back(causal_position_view(v, vs, t_begin + i, v_tail, v_begin));
  }
  thread_decoder().run(kv, vv, q_heads, q, out);
}
#else
void cuda_decode(const SideStore&, const SideStore&, const float*, int64_t, float*, bool) {
  fail("{}", cuda_unavailable());
}
#endif

void require_cuda() {
  if (const std::string why = cuda_unavailable(); !why.empty()) fail("{}", why);
}

}  // namespace

std::unique_ptr<SideStore> make_backend_side(AttentionBackend b, const SchemeSpec& spec, Role role,
                                             int64_t heads, int64_t dim, int layer) {
  if (b != AttentionBackend::kCuda)
    return make_side(spec, role, heads, dim, layer, side_kernels(b));
  const SchemeSpec one = spec.for_layer(layer);
  require_supported(b, one, AttentionOp::kDecode);
  require_cuda();
#if KVQ_HAVE_CUDA
  return std::make_unique<CudaSide>(one.side(role), role, heads, dim, layer);
#else
  fail("{}", cuda_unavailable());
#endif
}

bool on_device(const SideStore& s) {
#if KVQ_HAVE_CUDA
  return dynamic_cast<const CudaSide*>(&s) != nullptr;
#else
  (void)s;
  return false;
#endif
}

StoredCopy stored_copy(const SideStore& s) {
#if KVQ_HAVE_CUDA
  if (const auto* c = dynamic_cast<const CudaSide*>(&s)) {
    auto h = std::make_shared<cuda::DeviceSide::HostCopy>(c->device().host_copy());
    return {h->view, h};
  }
#endif
  return {s.stored(), nullptr};
}

DeviceReport device_report(AttentionBackend b) {
  KVQ_CHECK(b == AttentionBackend::kCuda, "backend {} runs on the host, not a device",
            to_string(b));
  require_cuda();
#if KVQ_HAVE_CUDA
  const cuda::DeviceProps p = cuda::device_props();
  return {p.name, p.driver_version, p.runtime_version, p.peak_gbps, p.peak_formula, p.total_memory};
#else
  fail("{}", cuda_unavailable());
#endif
}

double time_device_decode_us(AttentionBackend b, std::span<const SideStore* const> k_pool,
                             std::span<const SideStore* const> v_pool, int64_t batch,
                             const float* q, int64_t q_heads, int repeats) {
  KVQ_CHECK(b == AttentionBackend::kCuda, "backend {} runs on the host, not a device",
            to_string(b));
  KVQ_CHECK(!k_pool.empty() && k_pool.size() == v_pool.size() && batch >= 1,
            "time_device_decode_us: {} key and {} value sides, batch {}", k_pool.size(),
            v_pool.size(), batch);
  require_cuda();
#if KVQ_HAVE_CUDA
  const SideStore& k0 = *k_pool[0];
  if (const std::string why = unsupported_shape(b, k0.heads(), k0.dim(), q_heads, batch);
      !why.empty())
    fail("backend cuda cannot run decode attention over {}", why);
  const int64_t row = q_heads * k0.dim(), n = static_cast<int64_t>(k_pool.size());
  std::vector<float> qs(static_cast<size_t>(batch * row));
  for (int64_t i = 0; i < batch; ++i) std::copy(q, q + row, qs.begin() + i * row);
  if (const Rotation* r = k0.rotation()) r->rotate(qs.data(), batch * q_heads);
  cuda::DeviceFloats qd(batch * row), od(batch * row);
  qd.upload(qs.data(), batch * row);
  // every step's views before the clock starts (the host work stays outside the events)
  const int steps = std::max(repeats, 1) + 1;
  std::vector<std::vector<StoredSide>> ks(static_cast<size_t>(steps)), vs(ks.size());
  int64_t next = 0;
  for (int r = 0; r < steps; ++r)
    for (int64_t i = 0; i < batch; ++i, ++next) {
      ks[static_cast<size_t>(r)].push_back(
          cuda_side(*k_pool[next % n], "key").device().device_view());
      vs[static_cast<size_t>(r)].push_back(
          cuda_side(*v_pool[next % n], "value").device().device_view());
    }
  cuda::DeviceDecoder decoder;
  size_t step = 0;
  return cuda::time_events_us(
      [&] {
        decoder.run(ks[step], vs[step], q_heads, qd.get(), od.get());
        ++step;
      },
      repeats);
#else
  (void)q;
  (void)q_heads;
  (void)repeats;
  fail("{}", cuda_unavailable());
#endif
}

double device_copy_gbps(AttentionBackend b, double bytes, int repeats) {
  KVQ_CHECK(b == AttentionBackend::kCuda, "backend {} runs on the host, not a device",
            to_string(b));
  require_cuda();
#if KVQ_HAVE_CUDA
  return cuda::copy_gbps(bytes, repeats);
#else
  (void)bytes;
  (void)repeats;
  fail("{}", cuda_unavailable());
#endif
}

void attend_decode(AttentionBackend b, const float* q, int64_t q_heads, const SideStore& k,
                   const SideStore& v, float* out, int threads, double working_set) {
  if (const std::string why = unsupported_shape(b, k.heads(), k.dim(), q_heads); !why.empty())
    fail("backend {} cannot run decode attention over {}", to_string(b), why);
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
  if (b == AttentionBackend::kCuda) {
    cuda_decode(k, v, q, q_heads, out, true);
  } else {
    const cpu::DecodeOptions opt{threads, int_mode(b), working_set};
    cpu::decode_attention(q, q_heads, k.stored(), v.stored(), out, opt);
  }
  unrotate_output(v, out, q_heads);
}

void append_device(SideStore& s, const float* x, int64_t n) {
#if KVQ_HAVE_CUDA
  auto* c = dynamic_cast<CudaSide*>(&s);
  KVQ_CHECK(c, "backend cuda: append_device takes a side made by make_backend_side(cuda, ...)");
  c->append_device(x, n);
#else
  (void)s, (void)x, (void)n;
  fail("{}", cuda_unavailable());
#endif
}

void attend_decode_device(const float* q, int64_t q_heads, const SideStore& k, const SideStore& v,
                          float* out) {
  const AttentionBackend b = AttentionBackend::kCuda;
  if (const std::string why = unsupported_shape(b, k.heads(), k.dim(), q_heads); !why.empty())
    fail("backend {} cannot run decode attention over {}", to_string(b), why);
#if KVQ_HAVE_CUDA
  if (k.rotation() || v.rotation()) {  // rotated on the host: attend_decode's path
    const int64_t n = q_heads * k.dim();
    std::vector<float> qh(static_cast<size_t>(n)), oh(static_cast<size_t>(n));
    cuda::download_floats(q, n, qh.data());
    attend_decode(b, qh.data(), q_heads, k, v, oh.data());
    cuda::upload_floats(oh.data(), n, out);
    return;
  }
#endif
  cuda_decode(k, v, q, q_heads, out, false);
}

void append_device_batch(std::span<SideStore* const> sides, std::span<const float* const> x,
                         int64_t n) {
  KVQ_CHECK(sides.size() == x.size(), "backend cuda: a batched append of {} sides from {} rows",
            sides.size(), x.size());
#if KVQ_HAVE_CUDA
  std::vector<cuda::DeviceSide*> dev;
  dev.reserve(sides.size());
  bool rotated = false;
  for (SideStore* s : sides) {
    auto* c = dynamic_cast<CudaSide*>(s);
    KVQ_CHECK(c,
              "backend cuda: append_device_batch takes sides made by make_backend_side(cuda, ...)");
    rotated = rotated || c->rotation() != nullptr;
    dev.push_back(&c->device_mut());
  }
  if (rotated) {  // rows rotated on the host: one side at a time
    for (size_t i = 0; i < sides.size(); ++i) append_device(*sides[i], x[i], n);
    return;
  }
  cuda::DeviceSide::append_batch(dev, x, n);
#else
  (void)n;
  fail("{}", cuda_unavailable());
#endif
}

void attend_decode_device_batch(const float* q, int64_t q_heads,
                                std::span<const SideStore* const> k,
                                std::span<const SideStore* const> v, float* out) {
  const AttentionBackend b = AttentionBackend::kCuda;
  KVQ_CHECK(!k.empty() && k.size() == v.size(),
            "backend cuda: batched decode over {} key and {} value sides", k.size(), v.size());
  if (const std::string why = unsupported_shape(b, k[0]->heads(), k[0]->dim(), q_heads);
      !why.empty())
    fail("backend {} cannot run decode attention over {}", to_string(b), why);
#if KVQ_HAVE_CUDA
  const int64_t row = q_heads * k[0]->dim();
  if (k[0]->rotation() || v[0]->rotation()) {  // rotated on the host: a sequence at a time
    for (size_t i = 0; i < k.size(); ++i)
      attend_decode_device(q + static_cast<int64_t>(i) * row, q_heads, *k[i], *v[i],
                           out + static_cast<int64_t>(i) * row);
    return;
  }
  std::vector<StoredSide> kv, vv;
  kv.reserve(k.size());
  vv.reserve(v.size());
  for (size_t i = 0; i < k.size(); ++i) {
    kv.push_back(cuda_side(*k[i], "key").device().device_view());
    vv.push_back(cuda_side(*v[i], "value").device().device_view());
  }
  thread_decoder().run(kv, vv, q_heads, q, out);
#else
  (void)q, (void)out;
  fail("{}", cuda_unavailable());
#endif
}

void prefill_device(SideStore& k, SideStore& v, const float* xk, const float* xv, int64_t stride,
                    int64_t n, const float* q, int64_t q_heads, float* out) {
  const AttentionBackend b = AttentionBackend::kCuda;
  if (const std::string why = unsupported_shape(b, k.heads(), k.dim(), q_heads); !why.empty())
    fail("backend {} cannot run causal attention over {}", to_string(b), why);
  const int64_t t_begin = k.tokens(), row = k.heads() * k.dim();
  KVQ_CHECK(n >= 1 && v.tokens() == t_begin && v.heads() == k.heads() && v.dim() == k.dim() &&
                stride >= row,
            "backend cuda: a prefill of {} rows {} floats apart over sides of {} and {} tokens "
            "(rows of {} floats)",
            n, stride, t_begin, v.tokens(), row);
#if KVQ_HAVE_CUDA
  auto* kc = dynamic_cast<CudaSide*>(&k);
  auto* vc = dynamic_cast<CudaSide*>(&v);
  KVQ_CHECK(kc && vc,
            "backend cuda: prefill_device takes sides made by make_backend_side(cuda, ...)");
  if (k.rotation() || v.rotation()) {  // rotated on the host: rows, q and output cross
    const int64_t span = (n - 1) * stride + row, qn = n * q_heads * k.dim();
    std::vector<float> buf(static_cast<size_t>(span)), kh(static_cast<size_t>(n * row)),
        vh(static_cast<size_t>(n * row)), qh(static_cast<size_t>(qn)), oh(static_cast<size_t>(qn));
    for (auto [x, h] : {std::pair{xk, &kh}, std::pair{xv, &vh}}) {
      cuda::download_floats(x, span, buf.data());
      for (int64_t r = 0; r < n; ++r)
        std::copy_n(buf.data() + r * stride, row, h->data() + r * row);
    }
    cuda::download_floats(q, qn, qh.data());
    std::vector<float> kt, vt;
    const int64_t kb = gather_exact_tail(k, kh.data(), n, kt, tail_space(b));
    const int64_t vb = gather_exact_tail(v, vh.data(), n, vt, tail_space(b));
    k.append(kh.data(), n);
    v.append(vh.data(), n);
    attend_causal(
        b, CausalArgs{qh.data(), n, q_heads, t_begin, &k, &v, {kt.data(), kb}, {vt.data(), vb}},
        oh.data());
    cuda::upload_floats(oh.data(), qn, out);
    return;
  }
  cuda::DeviceDecoder& d = thread_decoder();
  float* kt = d.scratch(0, kc->device().tail_tokens(n) * row);
  float* vt = d.scratch(1, vc->device().tail_tokens(n) * row);
  const int64_t kb = kc->device().exact_tail_device(xk, n, stride, kt);
  const int64_t vb = vc->device().exact_tail_device(xv, n, stride, vt);
  // the chunk's rows, now contiguous at the tails' ends, appended from there
  kc->append_device(kt + (t_begin - kb) * row, n);
  vc->append_device(vt + (t_begin - vb) * row, n);
  cuda_causal(k, v, t_begin, n, q_heads, q, kt, kb, vt, vb, out);
#else
  (void)xk, (void)xv, (void)q, (void)out;
  fail("{}", cuda_unavailable());
#endif
}

int64_t device_memory_used(AttentionBackend b) {
  KVQ_CHECK(b == AttentionBackend::kCuda, "backend {} runs on the host, not a device",
            to_string(b));
  require_cuda();
#if KVQ_HAVE_CUDA
  return cuda::device_memory_used();
#else
  fail("{}", cuda_unavailable());
#endif
}

namespace {
// A sliding window runs on backends ref and cpu (cpu::CausalInput::window): refuse a call it would
// change on any other.
void check_window(AttentionBackend b, const CausalArgs& a) {
  KVQ_CHECK(b == AttentionBackend::kRef || b == AttentionBackend::kCpu ||
                b == AttentionBackend::kCpuInt8 || a.window <= 0 || a.t_begin + a.n <= a.window,
            "backend {} has no sliding-window attention: this layer's window is {} tokens and "
            "the cache holds {}; use backend ref (or at most {} tokens)",
            to_string(b), a.window, a.t_begin + a.n, a.window);
}
}  // namespace

namespace {
// attend_causal on backend cuda (checked by the caller): q and the host tails up, the launch, out
// down.
void cuda_attend_causal(const CausalArgs& a, float* out) {
  const SideStore &k = *a.k, &v = *a.v;
  if (const std::string why =
          unsupported_shape(AttentionBackend::kCuda, k.heads(), k.dim(), a.q_heads);
      !why.empty())
    fail("backend cuda cannot run causal attention over {}", why);
#if KVQ_HAVE_CUDA
  cuda_side(k, "key");  // device sides, before anything touches the device
  cuda_side(v, "value");
  const int64_t row = k.heads() * k.dim(), T = a.t_begin + a.n, qn = a.n * a.q_heads * k.dim();
  std::vector<float> qr;
  const float* q = a.q;
  if (const Rotation* r = k.rotation()) {  // the codes are rotated: q too
    qr.assign(q, q + qn);
    r->rotate(qr.data(), a.n * a.q_heads);
    q = qr.data();
  }
  cuda::DeviceDecoder& d = thread_decoder();
  auto up = [&](int slot, ExactTail e) -> const float* {
    const int64_t count = (T - e.begin) * row;
    if (!e.data || count <= 0) return nullptr;
    float* p = d.scratch(slot, count);
    cuda::upload_floats(e.data, count, p);
    return p;
  };
  const float* kt = up(0, a.k_exact);
  const float* vt = up(1, a.v_exact);
  float* qd = d.scratch(2, qn);
  float* od = d.scratch(3, qn);
  cuda::upload_floats(q, qn, qd);
  cuda_causal(k, v, a.t_begin, a.n, a.q_heads, qd, kt, a.k_exact.begin, vt, a.v_exact.begin, od);
  cuda::download_floats(od, qn, out);
  unrotate_output(v, out, a.n * a.q_heads);
#else
  (void)v, (void)out;
  fail("{}", cuda_unavailable());
#endif
}
}  // namespace

CausalCall::CausalCall(AttentionBackend b, const CausalArgs& a, int threads, double working_set)
    : b_(b), a_(a) {
  require_causal(b, a);
  KVQ_CHECK(b != AttentionBackend::kCuda,
            "backend cuda's causal attention is one device call (attend_causal, prefill_device), "
            "not host work items (CausalCall)");
  check_window(b, a);
  KVQ_CHECK(a.k && a.v, "causal attention: no sides given");
  causal_attention_check(a.n, a.q_heads, a.t_begin, *a.k, *a.v, a.k_exact, a.v_exact);
  if (b == AttentionBackend::kRef) return;
  cpu::CausalInput in =
      cpu_causal_input(a.q, a.n, a.q_heads, a.t_begin, *a.k, *a.v, a.k_exact, a.v_exact, buf_);
  in.int_mode = int_mode(b);
  in.window = a.window;
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
  require_causal(b, a);
  check_window(b, a);
  if (b == AttentionBackend::kRef) {
    causal_attention(a.q, a.n, a.q_heads, a.t_begin, *a.k, *a.v, a.k_exact, a.v_exact, out, threads,
                     a.window);
    return;
  }
  causal_attention_check(a.n, a.q_heads, a.t_begin, *a.k, *a.v, a.k_exact, a.v_exact);
  if (b == AttentionBackend::kCuda) {
    cuda_attend_causal(a, out);
    return;
  }
  CpuCausalBuffers buf;
  cpu::CausalInput in =
      cpu_causal_input(a.q, a.n, a.q_heads, a.t_begin, *a.k, *a.v, a.k_exact, a.v_exact, buf);
  in.int_mode = int_mode(b);
  in.window = a.window;
  cpu::causal_attention(in, out, threads);
  unrotate_output(*a.v, out, a.n * a.q_heads);
}

}  // namespace kvq
