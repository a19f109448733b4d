#include "evaluation/throughput.h"

#include <malloc.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "cache/side.h"
#include "core/error.h"
#include "evaluation/channel_stats.h"
#include "evaluation/synthetic.h"
#include "kernels/backend.h"
#include "reference_cpu/attention.h"

namespace kvq::eval {
namespace {

// Seconds: process CPU time with one thread (robust on a shared machine), wall time with more.
double now(int threads) {
  if (threads == 1) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Quantize is timed in steady state: the stores' memory stays mapped from one repetition to the
// next (no mmap per large vector, no trim on free), so a repetition times the conversion, not the
// kernel's zeroing of fresh pages, which a serving engine's preallocated cache never pays per token.
// Issue 50 item 2: bf16's 4 MB of stores at 1k faulted in on every repetition, about twice the
// conversion's own time, and every other scheme (a quarter of the bytes) read 4-5x faster than it.
// glibc's defaults are restored after.
struct ResidentHeap {
#if defined(__GLIBC__)
  ResidentHeap() {
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, INT_MAX);
  }
  ~ResidentHeap() {
    mallopt(M_MMAP_MAX, 65536);            // glibc's DEFAULT_MMAP_MAX
    mallopt(M_TRIM_THRESHOLD, 128 * 1024);  // glibc's DEFAULT_TRIM_THRESHOLD
  }
#else
  ResidentHeap() = default;
#endif
  ResidentHeap(const ResidentHeap&) = delete;
  ResidentHeap& operator=(const ResidentHeap&) = delete;
};

// Minor page faults of this process so far.
long minor_faults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

struct Sides {
  std::unique_ptr<SideStore> k, v;
};

Sides build(const SchemeSpec& spec, const ThroughputInput& in, const SideKernels& kernels) {
  const ThroughputShape& s = in.shape;
  Sides out{make_side(spec, Role::Key, s.heads, s.head_dim, 0, kernels),
            make_side(spec, Role::Value, s.heads, s.head_dim, 0, kernels)};
  out.k->append(in.k.data.data(), in.context);
  out.v->append(in.v.data.data(), in.context);
  return out;
}

}  // namespace

ThroughputInput throughput_input(const ThroughputShape& shape, int64_t context, uint64_t seed) {
  KVQ_CHECK(context >= 1 && shape.heads >= 1 && shape.head_dim >= 1 && shape.gqa >= 1,
            "throughput: context {} and shape heads={} head_dim={} gqa={} must be >= 1", context,
            shape.heads, shape.head_dim, shape.gqa);
  ThroughputInput in;
  in.shape = shape;
  in.context = context;
  in.k = synthetic_kv({{context, shape.heads, shape.head_dim}, 2, 12.0f, seed});
  in.v = synthetic_kv({{context, shape.heads, shape.head_dim}, 0, 1.0f, seed + 1});
  std::mt19937 rng(static_cast<uint32_t>(seed + 2));
  std::normal_distribution<float> nd;
  in.q.resize(static_cast<size_t>(shape.heads * shape.gqa * shape.head_dim));
  for (float& x : in.q) x = nd(rng);
  return in;
}

namespace {

// Backend cuda: the pool of device sides, each step's sequences distinct (time_device_decode_us).
Timing time_decode_device(const SchemeSpec& spec, const ThroughputInput& in, int64_t batch,
                          AttentionBackend backend, const ThroughputOptions& opt) {
  const ThroughputShape& s = in.shape;
  const int64_t q_heads = s.heads * s.gqa;
  if (const std::string why = unsupported_shape(backend, s.heads, s.head_dim, q_heads, batch);
      !why.empty())
    fail("throughput: backend {} cannot run decode attention over {}", to_string(backend), why);
  auto side = [&](Role r) {
    auto p = make_backend_side(backend, spec, r, s.heads, s.head_dim);
    p->append((r == Role::Key ? in.k : in.v).data.data(), in.context);
    return p;
  };
  std::vector<std::unique_ptr<SideStore>> ks, vs;
  ks.push_back(side(Role::Key));
  vs.push_back(side(Role::Value));
  const double seq_bytes = ks[0]->footprint().total_bytes() + vs[0]->footprint().total_bytes();
  const int64_t n = std::clamp<int64_t>(
      std::max<int64_t>(static_cast<int64_t>(std::ceil(opt.pool_bytes / std::max(seq_bytes, 1.0))),
                        batch),
      1, 4096);
  const DeviceReport dev = device_report(backend);
  KVQ_CHECK(static_cast<double>(n) * seq_bytes <= 0.8 * static_cast<double>(dev.memory_bytes),
            "throughput: {} caches of {:.0f} MiB (batch {}, context {}) do not fit 80% of the {}'s "
            "{:.0f} GiB; use a smaller context or batch",
            n, seq_bytes / (1 << 20), batch, in.context, dev.name,
            static_cast<double>(dev.memory_bytes) / (1 << 30));
  while (static_cast<int64_t>(ks.size()) < n) {
    ks.push_back(side(Role::Key));
    vs.push_back(side(Role::Value));
  }
  std::vector<const SideStore*> kp, vp;
  for (size_t i = 0; i < ks.size(); ++i) {
    kp.push_back(ks[i].get());
    vp.push_back(vs[i].get());
  }
  Timing res;
  res.us = time_device_decode_us(backend, kp, vp, batch, in.q.data(), q_heads, opt.repeats);
  res.bytes = seq_bytes * static_cast<double>(batch);
  res.stored_bytes_per_token = seq_bytes / static_cast<double>(in.context);
  res.distinct_caches = n;
  res.clock = "CUDA events";
  return res;
}

}  // namespace

Timing time_decode(const SchemeSpec& spec, const ThroughputInput& in, int64_t batch,
                   AttentionBackend backend, const ThroughputOptions& opt) {
  KVQ_CHECK(batch >= 1, "throughput: batch {} must be >= 1", batch);
  require_supported(backend, spec, AttentionOp::kDecode);
  if (!backend_info(backend).host) return time_decode_device(spec, in, batch, backend, opt);
  // The pool: enough distinct caches that a step's reads are cold (see the header), built with
  // backend cpu's quantizers whatever the backend timed (the bytes are the reference's).
  const SideKernels kern = cpu_side_kernels();
  std::vector<Sides> pool;
  pool.push_back(build(spec, in, kern));
  const double seq_bytes =
      pool[0].k->footprint().total_bytes() + pool[0].v->footprint().total_bytes();
  const int64_t n = std::clamp<int64_t>(
      static_cast<int64_t>(std::ceil(opt.pool_bytes / std::max(seq_bytes, 1.0))), 1, 4096);
  while (static_cast<int64_t>(pool.size()) < n) pool.push_back(build(spec, in, kern));
  const int64_t q_heads = in.shape.heads * in.shape.gqa;
  std::vector<float> out(static_cast<size_t>(q_heads * in.shape.head_dim));
  // the pool passes through the caches between two steps on one cache: the kernels stream it
  const double working_set = seq_bytes * static_cast<double>(n);
  int64_t next = 0;
  auto step = [&] {
    for (int64_t b = 0; b < batch; ++b) {
      const Sides& s = pool[static_cast<size_t>(next++ % n)];
      // a rot= side reads a rotated query and gives a rotated output (timed with it)
      attend_decode(backend, in.q.data(), q_heads, *s.k, *s.v, out.data(), opt.threads,
                    working_set);
    }
  };
  step();  // warm-up (page faults, thread team)
  std::vector<double> t;
  for (int r = 0; r < std::max(opt.repeats, 1); ++r) {
    const double t0 = now(opt.threads);
    step();
    t.push_back(now(opt.threads) - t0);
  }
  Timing res;
  res.us = 1e6 * median(t);
  res.bytes = seq_bytes * static_cast<double>(batch);
  res.stored_bytes_per_token = seq_bytes / static_cast<double>(in.context);
  res.distinct_caches = n;
  res.clock = opt.threads == 1 ? "process CPU time" : "wall time";
  return res;
}

Timing time_quantize(const SchemeSpec& spec, const ThroughputInput& in, AttentionBackend backend,
                     const ThroughputOptions& opt) {
  KVQ_CHECK(backend_info(backend).host,
            "throughput: op quantize runs on the host backends ({}); backend {}'s quantize kernels "
            "are measured by bench_kivi_cuda and bench_fp8_cuda",
            backend_names(", ", true), to_string(backend));
  const SideKernels kern = side_kernels(backend);
  const ResidentHeap resident;
  std::vector<double> t, faults;
  double seq_bytes = 0;
  for (int r = 0; r < std::max(opt.repeats, 1) + 1; ++r) {  // the first is a warm-up
    const long f0 = minor_faults();
    const double t0 = now(1);  // quantization is single-threaded
    const Sides s = build(spec, in, kern);
    const double dt = now(1) - t0;
    if (r > 0) {
      t.push_back(dt);
      faults.push_back(static_cast<double>(minor_faults() - f0));
    }
    seq_bytes = s.k->footprint().total_bytes() + s.v->footprint().total_bytes();
  }
  Timing res;
  res.us = 1e6 * median(t);
  res.page_faults = median(faults);
  res.clock = "process CPU time";
  res.bytes = 2.0 * static_cast<double>(in.k.data.size()) * sizeof(float);
  res.stored_bytes_per_token = seq_bytes / static_cast<double>(in.context);
  return res;
}

double memcpy_gbps(double bytes, const ThroughputOptions& opt) {
  const size_t n = static_cast<size_t>(bytes);
  std::vector<char> a(n, 1), b(n, 0);
  std::vector<double> t;
  for (int r = 0; r < std::max(opt.repeats, 1) + 1; ++r) {
    const double t0 = now(1);
    std::memcpy(b.data(), a.data(), n);
    const double dt = now(1) - t0;
    if (r > 0) t.push_back(dt);
    a[static_cast<size_t>(r) % n] = b[(static_cast<size_t>(r) * 7) % n];  // keep both live
  }
  return bytes / median(t) / 1e9;
}

}  // namespace kvq::eval
