// Backend cuda's cache side and decode call (device_side.h): host code over the CUDA runtime and
// the existing launchers (fp8_kernels.cuh, kivi_cache_device.cuh, attention_kernels.cuh).
#include "kernels/cuda/device_side.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <utility>
#include <variant>

#include "core/error.h"
#include "fp8/scale.h"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_kernels.cuh"
#include "kernels/cuda/kivi_cache_device.cuh"
#include "kernels/cuda/model_kernels.h"

namespace kvq::cuda {
namespace {

// A growing device array (geometric, keeps its contents).
template <typename T>
struct Grow {
  T* ptr = nullptr;
  int64_t cap = 0;
  Grow() = default;
  Grow(const Grow&) = delete;
  Grow& operator=(const Grow&) = delete;
  Grow(Grow&& o) noexcept : ptr(std::exchange(o.ptr, nullptr)), cap(std::exchange(o.cap, 0)) {}
  Grow& operator=(Grow&& o) noexcept {
    std::swap(ptr, o.ptr);
    std::swap(cap, o.cap);
    return *this;
  }
  ~Grow() {
    if (ptr) cudaFree(ptr);
  }
  void need(int64_t n, int64_t keep) {
    if (n <= cap) return;
    const int64_t c = std::max<int64_t>(n, cap + cap / 2);
    T* p = nullptr;
    KVQ_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), static_cast<size_t>(c) * sizeof(T)));
    if (keep > 0)
      KVQ_CUDA_CHECK(
          cudaMemcpy(p, ptr, static_cast<size_t>(keep) * sizeof(T), cudaMemcpyDeviceToDevice));
    if (ptr) KVQ_CUDA_CHECK(cudaFree(ptr));
    ptr = p;
    cap = c;
  }
};

template <typename T>
std::vector<T> download(const T* p, int64_t n) {
  std::vector<T> out(static_cast<size_t>(n));
  if (n > 0)
    KVQ_CUDA_CHECK(
        cudaMemcpy(out.data(), p, static_cast<size_t>(n) * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

// The one upload buffer every append goes through, locked for the whole append: all work is on
// the legacy default stream, so the next upload into it (any thread's) waits for the kernels the
// holder queued, and no upload can come between the holder's copy and its launches.
struct Staged {
  std::unique_lock<std::mutex> lock;
  float* ptr = nullptr;
};
Staged staging(const float* x, int64_t count) {
  static std::mutex m;
  static Grow<float>* buf = new Grow<float>;  // never freed: used until the process exits
  Staged st{std::unique_lock<std::mutex>(m), nullptr};
  buf->need(count, 0);
  KVQ_CUDA_CHECK(
      cudaMemcpy(buf->ptr, x, static_cast<size_t>(count) * sizeof(float), cudaMemcpyHostToDevice));
  st.ptr = buf->ptr;
  return st;
}

struct Bf16Store {
  Grow<uint16_t> data;
};

struct Fp8Store {
  Granularity gran = Granularity::Tensor;
  bool fixed = false;  // constant / calib scales: uploaded once
  Grow<uint8_t> codes;
  Grow<float> scales;
};

}  // namespace

const std::string& no_device_reason() {
  static const std::string why = [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
      return fmt::format("backend cuda: no CUDA device (cudaGetDeviceCount: {}: {})",
                         cudaGetErrorName(e), cudaGetErrorString(e));
    if (n == 0) return std::string("backend cuda: no CUDA device (cudaGetDeviceCount returned 0)");
    return std::string();
  }();
  return why;
}

void require_device() {
  if (!no_device_reason().empty()) throw Error(no_device_reason());
}

DeviceProps device_props() {
  require_device();
  cudaDeviceProp p{};
  KVQ_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  DeviceProps d;
  d.name = p.name;
  KVQ_CUDA_CHECK(cudaDriverGetVersion(&d.driver_version));
  KVQ_CUDA_CHECK(cudaRuntimeGetVersion(&d.runtime_version));
  // CUDA 13 dropped memoryClockRate from cudaDeviceProp: the attributes hold both.
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&d.memory_clock_khz, cudaDevAttrMemoryClockRate, 0));
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&d.bus_width_bits, cudaDevAttrGlobalMemoryBusWidth, 0));
  d.peak_gbps = 2.0 * d.memory_clock_khz * 1e3 * (d.bus_width_bits / 8.0) / 1e9;
  d.peak_formula = fmt::format(
      "memory clock {} kHz x bus width {} bits / 8 x 2 (double data rate), from "
      "cudaDeviceGetAttribute",
      d.memory_clock_khz, d.bus_width_bits);
  d.total_memory = static_cast<int64_t>(p.totalGlobalMem);
  d.sm_count = p.multiProcessorCount;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  return d;
}

int64_t device_memory_used() {
  require_device();
  size_t free_bytes = 0, total = 0;
  KVQ_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return static_cast<int64_t>(total - free_bytes);
}

std::string device_side_unsupported(const SchemeSpec& spec, Role role) {
  (void)role;
  switch (spec.kind()) {
    case SchemeKind::Bf16:
      return "";
    case SchemeKind::Fp32:
    case SchemeKind::Fp16:
      return "fp32 and fp16 caches (the CUDA decode kernels read bf16, fp8 and int codes)";
    case SchemeKind::Fp8:
      if (spec.fp8().source == ScaleSource::Dynamic && spec.fp8().gran != Granularity::Token)
        return "dynamic fp8 scales per tensor, head or channel (first=N holds tokens exact, "
               "which the CUDA decode kernels do not read); use gran=token or a constant / calib "
               "scale";
      return "";
    case SchemeKind::Int:
      if (spec.q().arith != Arith::Exact) return "arith=fp16 (KIVI's reference arithmetic)";
      return "";
  }
  return "this scheme kind";
}

struct DeviceSide::Impl {
  SchemeSpec spec;
  Role role;
  int64_t H, D;
  int layer;
  int64_t tokens = 0;
  std::variant<Bf16Store, Fp8Store, KiviSideCache> store;

  Impl(const SchemeSpec& s, Role r, int64_t h, int64_t d, int l)
      : spec(s), role(r), H(h), D(d), layer(l), store(make(s, r, h, d)) {}

  static std::variant<Bf16Store, Fp8Store, KiviSideCache> make(const SchemeSpec& s, Role r,
                                                               int64_t h, int64_t d) {
    if (s.kind() == SchemeKind::Int) return KiviSideCache(s.q(), r, h, d);
    if (s.kind() == SchemeKind::Fp8) return Fp8Store{};
    return Bf16Store{};
  }
};

DeviceSide::DeviceSide(const SchemeSpec& spec, Role role, int64_t heads, int64_t dim, int layer) {
  KVQ_CHECK(heads >= 1 && dim >= 1, "backend cuda: heads {} and head_dim {} must be >= 1", heads,
            dim);
  KVQ_CHECK(!spec.split() && !spec.layered() && !spec.rot.on && spec.sink == 0,
            "backend cuda: DeviceSide takes one side's scheme without rot= and sink= (got {})",
            spec.canonical());
  const std::string why = device_side_unsupported(spec, role);
  KVQ_CHECK(why.empty(), "backend cuda does not store {}: {}", spec.canonical(), why);
  p_ = std::make_unique<Impl>(spec, role, heads, dim, layer);
  if (auto* f = std::get_if<Fp8Store>(&p_->store)) {
    const Fp8Spec& s = spec.fp8();
    f->gran = s.source == ScaleSource::Constant ? Granularity::Tensor : s.gran;
    if (s.source != ScaleSource::Dynamic) {
      // fixed scales, read as the CPU side reads them (a zero-token tensor: calib ignores it)
      const std::vector<float> sc = fp8::compute_scales(s, role, Tensor3({0, heads, dim}), layer);
      require_device();
      f->scales.need(static_cast<int64_t>(sc.size()), 0);
      KVQ_CUDA_CHECK(
          cudaMemcpy(f->scales.ptr, sc.data(), sc.size() * sizeof(float), cudaMemcpyHostToDevice));
      f->fixed = true;
    }
  }
}

DeviceSide::~DeviceSide() = default;
DeviceSide::DeviceSide(DeviceSide&&) noexcept = default;
DeviceSide& DeviceSide::operator=(DeviceSide&&) noexcept = default;

int64_t DeviceSide::tokens() const { return p_->tokens; }
int64_t DeviceSide::heads() const { return p_->H; }
int64_t DeviceSide::dim() const { return p_->D; }

int64_t DeviceSide::quantized_tokens_at(int64_t t) const {
  if (const auto* c = std::get_if<KiviSideCache>(&p_->store))
    return kvq::quantized_tokens(c->spec(), c->axis(), t);
  return t;
}

void DeviceSide::reserve(int64_t t) {
  KVQ_CHECK(t >= 0, "backend cuda: reserve({}) must be >= 0", t);
  require_device();
  Impl& p = *p_;
  const int64_t row = p.H * p.D;
  if (auto* b = std::get_if<Bf16Store>(&p.store)) b->data.need(t * row, p.tokens * row);
  if (auto* f = std::get_if<Fp8Store>(&p.store)) {
    f->codes.need(t * row, p.tokens * row);
    if (f->gran == Granularity::Token) f->scales.need(t * p.H, p.tokens * p.H);
  }
  if (auto* c = std::get_if<KiviSideCache>(&p.store)) KVQ_CUDA_CHECK(c->reserve(t));
}

void DeviceSide::append(const float* x, int64_t n) {
  KVQ_CHECK(n >= 0, "backend cuda: append of {} tokens", n);
  if (n == 0) return;
  KVQ_CHECK(x != nullptr, "backend cuda: append of a null x");
  require_device();
  const Staged st = staging(x, n * p_->H * p_->D);  // held until the launches are queued
  append_device(st.ptr, n);
}

void DeviceSide::append_device(const float* x, int64_t n) {
  KVQ_CHECK(n >= 0, "backend cuda: append of {} tokens", n);
  if (n == 0) return;
  KVQ_CHECK(x != nullptr, "backend cuda: append of a null x");
  require_device();
  Impl& p = *p_;
  const int64_t row = p.H * p.D, T = p.tokens;
  if (auto* b = std::get_if<Bf16Store>(&p.store)) {
    b->data.need(std::max((T + n) * row, 2 * T * row), T * row);
    model::to_bf16(x, n * row, b->data.ptr + T * row);
  } else if (auto* f = std::get_if<Fp8Store>(&p.store)) {
    f->codes.need(std::max((T + n) * row, 2 * T * row), T * row);
    const Shape3 shape{n, p.H, p.D};
    if (f->gran == Granularity::Token && !f->fixed) {  // per (token, head): streaming-safe
      f->scales.need(std::max((T + n) * p.H, 2 * T * p.H), T * p.H);
      KVQ_CUDA_CHECK(fp8_quantize_dynamic_token(p.spec.fp8().format, shape, x,
                                                f->scales.ptr + T * p.H, f->codes.ptr + T * row));
    } else {
      KVQ_CUDA_CHECK(fp8_quantize(p.spec.fp8().format, f->gran, shape, x, f->scales.ptr,
                                  f->codes.ptr + T * row));
    }
  } else {
    KVQ_CUDA_CHECK(std::get<KiviSideCache>(p.store).append(x, n));
  }
  p.tokens += n;
}

void DeviceSide::append_batch(std::span<DeviceSide* const> sides, std::span<const float* const> x,
                              int64_t n) {
  KVQ_CHECK(sides.size() == x.size(), "backend cuda: a batched append of {} sides from {} rows",
            sides.size(), x.size());
  KVQ_CHECK(n >= 0, "backend cuda: append of {} tokens", n);
  if (sides.empty() || n == 0) return;
  const Impl& p0 = *sides[0]->p_;
  for (size_t i = 0; i < sides.size(); ++i) {
    KVQ_CHECK(sides[i] != nullptr && x[i] != nullptr,
              "backend cuda: batched append: side {} or its rows are null", i);
    const Impl& p = *sides[i]->p_;
    // the kind, role and shape here; an int side's bits, group, residual... append_batch checks
    KVQ_CHECK(
        p.store.index() == p0.store.index() && p.role == p0.role && p.H == p0.H && p.D == p0.D,
        "backend cuda: batched append: side {} holds {} [{} x {}], side 0 {} [{} x {}]", i,
        p.spec.canonical(), p.H, p.D, p0.spec.canonical(), p0.H, p0.D);
    for (size_t j = 0; j < i; ++j)
      KVQ_CHECK(sides[j] != sides[i], "backend cuda: batched append: sides {} and {} are one side",
                j, i);
  }
  require_device();
  if (std::holds_alternative<KiviSideCache>(p0.store)) {
    std::vector<KiviSideCache*> caches;
    for (DeviceSide* s : sides) caches.push_back(&std::get<KiviSideCache>(s->p_->store));
    const std::vector<int64_t> counts(sides.size(), n);
    KVQ_CUDA_CHECK(KiviSideCache::append_batch(caches, x, counts));
  } else if (std::holds_alternative<Bf16Store>(p0.store)) {
    const int64_t row = p0.H * p0.D;
    std::vector<uint16_t*> out;
    for (DeviceSide* s : sides) {  // every side's room first (a reallocation copies synchronously)
      Impl& p = *s->p_;
      Bf16Store& b = std::get<Bf16Store>(p.store);
      b.data.need(std::max((p.tokens + n) * row, 2 * p.tokens * row), p.tokens * row);
      out.push_back(b.data.ptr + p.tokens * row);
    }
    for (size_t j0 = 0; j0 < sides.size(); j0 += model::kBf16Jobs) {
      const size_t nj = std::min<size_t>(model::kBf16Jobs, sides.size() - j0);
      model::to_bf16_jobs(x.subspan(j0, nj), std::span<uint16_t* const>(out).subspan(j0, nj),
                          n * row);
    }
  } else {  // fp8: a quantize launch a side (append_device counts the tokens)
    for (size_t i = 0; i < sides.size(); ++i) sides[i]->append_device(x[i], n);
    return;
  }
  for (DeviceSide* s : sides) s->p_->tokens += n;
}

StoredSide DeviceSide::device_view() const {
  const Impl& p = *p_;
  StoredSide s{p.spec.kind(), p.tokens, p.H, p.D};
  if (const auto* b = std::get_if<Bf16Store>(&p.store)) {
    s.half16 = b->data.ptr;
  } else if (const auto* f = std::get_if<Fp8Store>(&p.store)) {
    s.codes = f->codes.ptr;
    s.fp8_scales = f->scales.ptr;
    s.format = p.spec.fp8().format;
    s.gran = f->gran;
  } else {
    const auto& c = std::get<KiviSideCache>(p.store);
    s.words = c.words();
    s.scales = c.scales();
    s.mins = c.mins();
    s.residual = c.residual();
    s.quantized_tokens = c.quantized_tokens();
    s.group = c.group();
    s.bits = c.bits();
    s.axis = c.axis();
    s.sym = c.sym();
  }
  return s;
}

void DeviceSide::exact_tail(std::vector<float>& out) const {
  const auto* c = std::get_if<KiviSideCache>(&p_->store);
  if (!c || c->residual_tokens() == 0) return;
  const std::vector<float> r = download(c->residual(), c->residual_tokens() * p_->H * p_->D);
  out.insert(out.end(), r.begin(), r.end());
}

int64_t DeviceSide::tail_tokens(int64_t n) const {
  const auto* c = std::get_if<KiviSideCache>(&p_->store);
  return (c ? c->residual_tokens() : 0) + n;
}

int64_t DeviceSide::exact_tail_device(const float* x, int64_t n, int64_t stride,
                                      float* tail) const {
  const Impl& p = *p_;
  const int64_t row = p.H * p.D;
  KVQ_CHECK(n >= 0 && stride >= row,
            "backend cuda: an exact tail of {} rows {} floats apart (rows of {} floats)", n, stride,
            row);
  require_device();
  int64_t r = 0;
  if (const auto* c = std::get_if<KiviSideCache>(&p.store); c && c->residual_tokens() > 0) {
    r = c->residual_tokens();
    KVQ_CUDA_CHECK(cudaMemcpyAsync(tail, c->residual(),
                                   static_cast<size_t>(r * row) * sizeof(float),
                                   cudaMemcpyDeviceToDevice, nullptr));
  }
  if (n > 0)
    KVQ_CUDA_CHECK(cudaMemcpy2DAsync(tail + r * row, static_cast<size_t>(row) * sizeof(float), x,
                                     static_cast<size_t>(stride) * sizeof(float),
                                     static_cast<size_t>(row) * sizeof(float),
                                     static_cast<size_t>(n), cudaMemcpyDeviceToDevice, nullptr));
  return p.tokens - r;
}

Footprint DeviceSide::footprint() const {
  return kvq::footprint(p_->spec, p_->role, Shape3{p_->tokens, p_->H, p_->D});
}

DeviceSide::HostCopy DeviceSide::host_copy() const {
  const Impl& p = *p_;
  HostCopy h;
  h.view = device_view();
  const int64_t n = p.tokens * p.H * p.D;
  if (p.tokens > 0) require_device();
  if (const auto* b = std::get_if<Bf16Store>(&p.store)) {
    h.half16 = download(b->data.ptr, n);
    h.view.half16 = h.half16.data();
  } else if (const auto* f = std::get_if<Fp8Store>(&p.store)) {
    h.codes = download(f->codes.ptr, n);
    const int64_t ns = fp8::scale_count(f->gran, Shape3{p.tokens, p.H, p.D});
    h.fp8_scales = download(f->scales.ptr, f->fixed || p.tokens > 0 ? ns : 0);
    h.view.codes = h.codes.data();
    h.view.fp8_scales = h.fp8_scales.data();
  } else {
    KiviSideCacheHost k;
    KVQ_CUDA_CHECK(std::get<KiviSideCache>(p.store).copy_to_host(k));
    h.words = std::move(k.words);
    h.scales = std::move(k.scales);
    h.mins = std::move(k.mins);
    h.residual = std::move(k.residual);
    h.view.words = h.words.data();
    h.view.scales = h.scales.data();
    h.view.mins = h.view.sym ? nullptr : h.mins.data();
    h.view.residual = h.residual.data();
  }
  return h;
}

// ---- decode --------------------------------------------------------------------------------

namespace {

Bf16SideView bf16_view(const StoredSide& s) { return {s.half16, s.tokens}; }
Fp8SideView fp8_view(const StoredSide& s) {
  return {s.codes, s.fp8_scales, s.tokens, s.format, s.gran};
}
IntSideView int_view(const StoredSide& s) {
  IntSideView v;
  v.words = s.words;
  v.scales = s.scales;
  v.mins = s.sym ? nullptr : s.mins;
  v.residual = s.residual;
  v.quantized_tokens = s.quantized_tokens;
  v.tokens = s.tokens;
  v.group = s.group;
  v.bits = s.bits;
  v.axis = s.axis;
  v.sym = s.sym;
  return v;
}

}  // namespace

struct DeviceDecoder::Impl {
  Grow<char> workspace;
  Grow<float> q, out;
  Grow<float> scratch[4];
};

DeviceDecoder::DeviceDecoder() : p_(std::make_unique<Impl>()) {}
DeviceDecoder::~DeviceDecoder() = default;

void DeviceDecoder::run(std::span<const StoredSide> k, std::span<const StoredSide> v,
                        int64_t q_heads, const float* q, float* out) {
  KVQ_CHECK(!k.empty() && k.size() == v.size(),
            "backend cuda: decode over {} key and {} value sides", k.size(), v.size());
  require_device();
  const StoredSide& k0 = k[0];
  const SchemeKind kind = k0.kind;
  for (size_t b = 0; b < k.size(); ++b) {
    KVQ_CHECK(k[b].kind == kind && v[b].kind == kind,
              "backend cuda: sequence {}: keys and values of one launch must be one kind", b);
    KVQ_CHECK(k[b].sink_tokens == 0 && v[b].sink_tokens == 0,
              "backend cuda: sink=S is not on backend cuda");
    KVQ_CHECK(k[b].heads == k0.heads && k[b].dim == k0.dim && v[b].heads == k0.heads &&
                  v[b].dim == k0.dim,
              "backend cuda: sequence {} has another shape", b);
  }
  const int64_t row = q_heads * k0.dim;
  for (size_t b0 = 0; b0 < k.size(); b0 += kMaxBatch) {
    const size_t nb = std::min<size_t>(kMaxBatch, k.size() - b0);
    DecodeShape shape;
    shape.batch = static_cast<int>(nb);
    shape.kv_heads = static_cast<int>(k0.heads);
    shape.q_heads = static_cast<int>(q_heads);
    shape.head_dim = static_cast<int>(k0.dim);
    const float* qb = q + static_cast<int64_t>(b0) * row;
    float* ob = out + static_cast<int64_t>(b0) * row;
    auto go = [&](auto convert) {
      using View = decltype(convert(k0));
      std::vector<View> kv(nb), vv(nb);
      for (size_t i = 0; i < nb; ++i) {
        kv[i] = convert(k[b0 + i]);
        vv[i] = convert(v[b0 + i]);
      }
      const DecodePlan plan =
          plan_decode(shape, std::span<const View>(kv), std::span<const View>(vv));
      p_->workspace.need(static_cast<int64_t>(plan.workspace_bytes), 0);
      KVQ_CUDA_CHECK(decode_attention(shape, std::span<const View>(kv), std::span<const View>(vv),
                                      qb, ob, p_->workspace.ptr, plan.workspace_bytes, nullptr,
                                      DecodeKernel::Mma));
    };
    switch (kind) {
      case SchemeKind::Bf16:
        go(bf16_view);
        break;
      case SchemeKind::Fp8:
        go(fp8_view);
        break;
      case SchemeKind::Int:
        go(int_view);
        break;
      default:
        fail("backend cuda: no decode kernel reads {} caches", static_cast<int>(kind));
    }
  }
}

void DeviceDecoder::run_host(const StoredSide& k, const StoredSide& v, int64_t q_heads,
                             const float* q, float* out) {
  require_device();
  const int64_t n = q_heads * k.dim;
  p_->q.need(n, 0);
  p_->out.need(n, 0);
  KVQ_CUDA_CHECK(
      cudaMemcpy(p_->q.ptr, q, static_cast<size_t>(n) * sizeof(float), cudaMemcpyHostToDevice));
  run(std::span<const StoredSide>(&k, 1), std::span<const StoredSide>(&v, 1), q_heads, p_->q.ptr,
      p_->out.ptr);
  KVQ_CUDA_CHECK(
      cudaMemcpy(out, p_->out.ptr, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToHost));
}

float* DeviceDecoder::scratch(int which, int64_t count) {
  KVQ_CHECK(which >= 0 && which < 4, "backend cuda: scratch slot {} outside [0, 4)", which);
  require_device();
  Grow<float>& g = p_->scratch[which];
  g.need(std::max<int64_t>(count, 1), 0);
  return g.ptr;
}

DeviceFloats::DeviceFloats(int64_t count) {
  require_device();
  KVQ_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_),
                            static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(float)));
}
DeviceFloats::~DeviceFloats() {
  if (p_) cudaFree(p_);
}
void DeviceFloats::upload(const float* host, int64_t count) {
  KVQ_CUDA_CHECK(
      cudaMemcpy(p_, host, static_cast<size_t>(count) * sizeof(float), cudaMemcpyHostToDevice));
}
void DeviceFloats::download(float* host, int64_t count) const {
  KVQ_CUDA_CHECK(
      cudaMemcpy(host, p_, static_cast<size_t>(count) * sizeof(float), cudaMemcpyDeviceToHost));
}

void download_floats(const float* device, int64_t n, float* host) {
  if (n <= 0) return;
  require_device();
  KVQ_CUDA_CHECK(
      cudaMemcpy(host, device, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToHost));
}

void upload_floats(const float* host, int64_t n, float* device) {
  if (n <= 0) return;
  require_device();
  KVQ_CUDA_CHECK(
      cudaMemcpy(device, host, static_cast<size_t>(n) * sizeof(float), cudaMemcpyHostToDevice));
}

double time_events_us(const std::function<void()>& fn, int repeats) {
  require_device();
  cudaEvent_t a = nullptr, b = nullptr;
  KVQ_CUDA_CHECK(cudaEventCreate(&a));
  KVQ_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  try {
    fn();  // warm-up
    KVQ_CUDA_CHECK(cudaDeviceSynchronize());
    for (int r = 0; r < std::max(repeats, 1); ++r) {
      KVQ_CUDA_CHECK(cudaEventRecord(a));
      fn();
      KVQ_CUDA_CHECK(cudaEventRecord(b));
      KVQ_CUDA_CHECK(cudaEventSynchronize(b));
      float t = 0;
      KVQ_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      ms.push_back(t);
    }
  } catch (...) {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    throw;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  const size_t m = ms.size();
  return 1e3 * (m % 2 ? ms[m / 2] : 0.5 * (ms[m / 2 - 1] + ms[m / 2]));
}

double copy_gbps(double bytes, int repeats) {
  require_device();
  const size_t n = static_cast<size_t>(bytes);
  Grow<char> a, b;
  a.need(static_cast<int64_t>(n), 0);
  b.need(static_cast<int64_t>(n), 0);
  KVQ_CUDA_CHECK(cudaMemset(a.ptr, 1, n));
  const double us = time_events_us(
      [&] { KVQ_CUDA_CHECK(cudaMemcpy(b.ptr, a.ptr, n, cudaMemcpyDeviceToDevice)); }, repeats);
  return bytes / (us * 1e-6) / 1e9;
}

}  // namespace kvq::cuda
