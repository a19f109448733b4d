// Backend `cpu`: the causal scheduler of kernels/cpu/attention.h, compiled once: checks a call,
// cuts it into work items (segments of positions, or tiles of positions), folds the segments'
// partials in order and finishes each position (sinks, fp8 channel scales). The kernels that fill
// a segment's partials (run_segment) are the CPU path's (kernels/cpu/attention/, chosen at run
// time: kernels/cpu/dispatch.cpp).
#include <omp.h>
#include <unistd.h>  // sysconf: the L3 size (beyond_l3)

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/footprint.h"
#include "core/half.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/segment.h"

namespace kvq::cpu {

namespace {

bool side_fast(const StoredSide& s, bool key) {
  if (s.kind != SchemeKind::Int) return true;
  const bool token_ok =
      s.axis == Axis::Token && (s.bits == 2 || s.bits == 4 || s.bits == 8) && s.group % 8 == 0;
  if (key) return s.axis == Axis::Channel || token_ok;  // per-channel: any bits, one shift/token
  return token_ok;
}

void check(const StoredSide& k, const StoredSide& v, int64_t q_heads) {
  KVQ_CHECK(k.heads == v.heads && k.dim == v.dim && k.tokens == v.tokens,
            "cpu attention: K cache [{}, {}, {}] and V cache [{}, {}, {}] differ", k.tokens,
            k.heads, k.dim, v.tokens, v.heads, v.dim);
  KVQ_CHECK(k.heads > 0 && q_heads > 0 && q_heads % k.heads == 0,
            "cpu attention: {} query heads is not a multiple of {} kv heads", q_heads, k.heads);
  KVQ_CHECK(k.tokens > 0, "cpu attention: the cache is empty");
}

// ---- the engine: fixed token segments folded in order ----------------------------------------

int64_t block_for(const StoredSide& k) {
  if (k.kind == SchemeKind::Int && k.axis == Axis::Channel)
    return k.group * std::max<int64_t>(1, kBlock / k.group);  // whole key groups
  return kBlock;
}

/// acc <- the merge of acc (the tokens before) and p (the next segment); `first` copies p.
/// M = max(m_a, m_p), l = e^(m_a - M) l_a + e^(m_p - M) l_p, o likewise.
void fold(Partial& acc, const Partial& p, bool first, int64_t D) {
  if (first) {
    acc.m = p.m;
    acc.l = p.l;
    acc.o = p.o;
    return;
  }
  for (size_t j = 0; j < acc.m.size(); ++j) {
    const float ma = acc.m[j], mp = p.m[j], M = std::max(ma, mp);
    const float ea = ma == -INFINITY ? 0.0f : std::exp(ma - M);
    const float ep = mp == -INFINITY ? 0.0f : std::exp(mp - M);
    acc.l[j] = ea * acc.l[j] + ep * p.l[j];
    float* o = acc.o.data() + static_cast<int64_t>(j) * D;
    const float* po = p.o.data() + static_cast<int64_t>(j) * D;
    for (int64_t d = 0; d < D; ++d) o[d] = ea * o[d] + ep * po[d];
    acc.m[j] = M;
  }
}

/// The sides as position t (0-based) of a causal call sees them: t + 1 tokens, the first `qt` from
/// the codes, the rest exact from the tail (null tail: the sides as stored).
StoredSide position_view(const StoredSide& s, int64_t t, int64_t qt, ExactTail tail) {
  if (!tail.data) return s;
  StoredSide v = s;
  v.tokens = t + 1;
  const int64_t row = s.heads * s.dim;
  if (s.kind == SchemeKind::Int) {
    v.quantized_tokens = std::min(qt, t + 1);
    v.residual = qt <= t ? tail.data + (qt - tail.begin) * row : nullptr;
    return v;
  }
  if (qt > t) return v;
  if (is_dense(s.kind)) {  // a view with another side's window (pre-RoPE keys read back)
    v.quantized_tokens = qt;
    v.residual = tail.data + (qt - tail.begin) * row;
    return v;
  }
  // FP8 holds its tokens exact until its scales freeze (quantized_tokens_at is 0 or t), so a
  // partly exact fp8 position reads every row from the tail.
  KVQ_CHECK(qt == 0 && tail.begin == 0,
            "cpu attention: an fp8 side with {} of {} tokens quantized has no such layout", qt,
            t + 1);
  StoredSide f;
  f.kind = SchemeKind::Fp32;
  f.tokens = t + 1;
  f.heads = s.heads;
  f.dim = s.dim;
  f.f32 = tail.data;
  return f;
}

}  // namespace

struct CausalAttention::Workspace::Impl {
  Scratch scratch;
  std::vector<Partial> acc, part;  // per position of a tile
  std::vector<float> s;            // the tile's score rows
};
CausalAttention::Workspace::Workspace() : impl(std::make_unique<Impl>()) {}
CausalAttention::Workspace::~Workspace() = default;

struct CausalAttention::Parts {
  std::vector<Partial> p;
};

namespace {
/// Partials a thread's last call left (CausalAttention's destructor), for its next call: a decode
/// call on several threads holds a partial per segment (64 of 16 KB at 32k, 8 kv heads x 4, d128);
/// allocated afresh each call, their pages came back from the kernel each time (page faults took
/// ~5% of the second thread's time at 32k, session 26).
std::vector<Partial>& spare_parts() {
  thread_local std::vector<Partial> spare;
  return spare;
}
}  // namespace

namespace {
/// The side without its sinks: the tokens from S on, indexed from 0.
StoredSide without_sinks(StoredSide s) {
  s.tokens -= s.sink_tokens;
  s.sink = nullptr;
  s.sink_tokens = 0;
  return s;
}
}  // namespace

CausalAttention::CausalAttention(const CausalInput& given, int members) : in_(given) {
  check(given.k, given.v, given.q_heads);
  KVQ_CHECK(given.n > 0 && given.t_begin >= 0 && given.k.tokens == given.t_begin + given.n,
            "cpu attention: the cache holds {} tokens, expected {} + {}", given.k.tokens,
            given.t_begin, given.n);
  const int64_t S = given.k.sink_tokens;
  KVQ_CHECK(given.window <= 0 || S == 0,
            "cpu attention: a sliding window (of {} tokens) with sinks (sink={}) runs on backend "
            "ref only",
            given.window, S);
  KVQ_CHECK(S == given.v.sink_tokens && S >= 0 && S <= given.k.tokens &&
                (S == 0 || (given.k.sink && given.v.sink)),
            "cpu attention: {} key sinks and {} value sinks of {} tokens (both sides the same, "
            "with their values)",
            S, given.v.sink_tokens, given.k.tokens);
  const bool tails = given.k_exact.data != nullptr;
  KVQ_CHECK(tails == (given.v_exact.data != nullptr),
            "cpu attention: give exact tails for both sides or for neither");
  KVQ_CHECK(tails || given.n == 1, "cpu attention: {} positions need exact tails", given.n);
  KVQ_CHECK(!tails || (static_cast<int64_t>(given.k_quantized.size()) == given.n &&
                       static_cast<int64_t>(given.v_quantized.size()) == given.n),
            "cpu attention: {} positions need {} quantized-token counts per side", given.n,
            given.n);
  q_heads_ = given.q_heads;
  dim_ = given.k.dim;
  if (S > 0) {
    // The positions before S read sinks only; the rest are a call over the tokens from S on,
    // with the sinks' partial folded in front (finish).
    sinks_ = S;
    q_ = given.q;
    t0_ = given.t_begin;
    k_sink_ = given.k.sink;
    v_sink_ = given.v.sink;
    kv_heads_ = given.k.heads;
    const int64_t row = given.k.heads * given.k.dim;
    sink_only_ = std::clamp<int64_t>(S - given.t_begin, 0, given.n);
    in_.k = without_sinks(given.k);
    in_.v = without_sinks(given.v);
    in_.q = given.q + sink_only_ * given.q_heads * dim_;
    in_.n = given.n - sink_only_;
    in_.t_begin = given.t_begin + sink_only_ - S;
    for (ExactTail* e : {&in_.k_exact, &in_.v_exact})
      if (e->data) {
        if (e->begin < S) {
          e->data += (S - e->begin) * row;
          e->begin = S;
        }
        e->begin -= S;
      }
    if (tails) {
      for (int64_t p = sink_only_; p < given.n; ++p) {
        kq_.push_back(given.k_quantized[static_cast<size_t>(p)] - S);
        vq_.push_back(given.v_quantized[static_cast<size_t>(p)] - S);
      }
      in_.k_quantized = kq_;
      in_.v_quantized = vq_;
    }
    if (in_.n == 0) return;  // every position reads sinks only (merge writes them)
  }
  const CausalInput& in = in_;  // the call over the tokens from the sinks on
  if (tails) {
    KVQ_CHECK(in.k_exact.begin <= in.k_quantized[0] && in.v_exact.begin <= in.v_quantized[0],
              "cpu attention: exact tails start at {} / {}, after the window of position {}",
              in.k_exact.begin, in.v_exact.begin, in.t_begin);
  }
  segment_ = block_for(in.k) * kBlocksPerSegment;
  const int m = std::max(1, members);
  if (in.n < m) {  // few positions: one item per (position, segment), folded by merge()
    first_item_.push_back(0);
    for (int64_t p = 0; p < in.n; ++p) first_item_.push_back(first_item_.back() + segments(p));
    parts_ = std::make_unique<Parts>();
    parts_->p.swap(spare_parts());  // the last call's partials: their vectors keep their memory
    parts_->p.resize(static_cast<size_t>(first_item_.back()));
  } else {  // tiles of positions, at least 4 per member when there are enough
    tile_ = std::clamp<int64_t>(in.n / (4 * m), 1, kTile);
  }
}

CausalAttention::~CausalAttention() {
  if (parts_) parts_->p.swap(spare_parts());
}

int64_t CausalAttention::segments(int64_t p) const {
  return (in_.t_begin + p + 1 + segment_ - 1) / segment_;
}

int64_t CausalAttention::items() const {
  if (in_.n == 0) return 0;
  return parts_ ? first_item_.back() : (in_.n + tile_ - 1) / tile_;
}

int64_t CausalAttention::merges() const { return sink_only_ + (parts_ ? in_.n : 0); }

Partial CausalAttention::sink_partial(int64_t p) const {
  const int64_t H = kv_heads_, D = dim_, nq = q_heads_ / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t u1 = std::min(sinks_, t0_ + p + 1);  // the sinks position p sees (>= 1)
  std::vector<float> sc(static_cast<size_t>(u1));
  Partial P;
  P.init(q_heads_, D);
  for (int64_t j = 0; j < q_heads_; ++j) {
    const float* q = q_ + (p * q_heads_ + j) * D;
    const int64_t h = j / nq;
    float m = -INFINITY;
    for (int64_t u = 0; u < u1; ++u) {
      const float* k = k_sink_ + (u * H + h) * D;
      float acc = 0;
      for (int64_t d = 0; d < D; ++d) acc += q[d] * k[d];
      sc[static_cast<size_t>(u)] = acc * scale;
      m = std::max(m, acc * scale);
    }
    float l = 0;
    float* o = P.o.data() + j * D;
    for (int64_t u = 0; u < u1; ++u) {
      const float e = std::exp(sc[static_cast<size_t>(u)] - m);
      l += e;
      const float* v = v_sink_ + (u * H + h) * D;
      for (int64_t d = 0; d < D; ++d) o[d] += e * v[d];
    }
    P.m[static_cast<size_t>(j)] = m;
    P.l[static_cast<size_t>(j)] = l;
  }
  return P;
}

/// One position's sides as it sees them (position_view), whether the SIMD path takes them, and
/// its call.
struct CausalAttention::Position {
  StoredSide k, v;
  bool fast = false;
  int64_t t = 0;      // the position's token index
  int64_t begin = 0;  // its sliding window's first token (CausalInput::window)
};

CausalAttention::Position CausalAttention::position(int64_t p) const {
  const int64_t t = in_.t_begin + p;
  const bool tails = in_.k_exact.data != nullptr;
  Position pos;
  pos.k = position_view(in_.k, t, tails ? in_.k_quantized[p] : 0, in_.k_exact);
  pos.v = position_view(in_.v, t, tails ? in_.v_quantized[p] : 0, in_.v_exact);
  pos.fast = has_fast_path(pos.k, pos.v, in_.q_heads);
  pos.t = t;
  if (in_.window > 0 && t + 1 > in_.window) {  // the window starts after token 0: portable path
    pos.begin = t + 1 - in_.window;
    pos.fast = false;
  }
  return pos;
}

namespace {
/// Whether a call's sides are read as streams from memory, which the system's L3 does not hold
/// between calls: their bytes exceed a sixth of the L3 it reports (or its size is unknown). Then
/// int sides prefetch ahead (per-token values a block of rows and their parameters, per-channel
/// keys the next group) and dense sides of one position take the address-order stream kernels
/// (prefetching kStreamAhead rows), else the cached kernels, without prefetch (fp8 sides take their
/// prefetch either way: without, 1.03-1.10x the time at 4k and 32k, session 26). Both hosts
/// measured with and without (A/B in one run):
/// - a Zen 5 VM (32 MB L3, sessions 12 and 14): int8 kivi4 at 32k (42 MB) 1.2-1.4x faster with the
///   prefetch, at 4k (5 MB) 3-8% slower;
/// - a Xeon VM (480 MB reported, shared; session 26): int8 kivi at 4k-64k (3-84 MB) 0.89-1.0x the
///   time without the prefetch, at 128k (101 / 168 MB) kivi2 / kivi4 1.04-1.08x / 1.20-1.29x; bf16
///   with the cached kernels at 1k-16k (4-67 MB) 0.73-0.93x the time, at 32k (134 MB) 1.56-1.78x.
///   A VM's share of the L3 is well under its size, and it moves with the neighbours' load: on a
///   slow memory day (session 29) that VM held 25-34 MB between calls, not 42 (kivi4 at 32k: exact
///   one thread 1.5-1.9x the time without the prefetch, two threads up to 1.8x; bf16 with the
///   cached kernels at 16k, 67 MB: 2.5x), while streaming what it held cost 1.0-1.1x. Missing
///   the L3 costs more than streaming needlessly, so the size assumed is at most kMaxL3Share.
constexpr double kMaxL3Share = 192.0 * (1 << 20);
int64_t& l3_override() {
  static int64_t bytes = -1;  // set_l3_bytes
  return bytes;
}
bool beyond_l3(const StoredSide& k, const StoredSide& v, double working_set) {
  static const double system_l3 = [] {
    const long b = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return b > 0 ? static_cast<double>(b) : 0.0;
  }();
  const double l3 =
      l3_override() >= 0 ? static_cast<double>(l3_override()) : std::min(system_l3, kMaxL3Share);
  return std::max(footprint(k).total_bytes() + footprint(v).total_bytes(), working_set) > l3 / 6;
}

Call make_call(const CausalInput& in, int64_t p, const StoredSide& k, const StoredSide& v,
               int64_t block) {
  const int64_t D = k.dim;
  return Call{in.q + p * in.q_heads * D,
              in.q_heads,
              k.heads,
              D,
              static_cast<int>(in.q_heads / k.heads),
              1.0f / std::sqrt(static_cast<float>(D)),
              k,
              v,
              in.int_mode,
              block,
              beyond_l3(k, v, in.working_set)};
}

}  // namespace

void CausalAttention::segment(const Position& pos, int64_t p, int64_t s, Partial& out,
                              Workspace& w) const {
  const Call c = make_call(in_, p, pos.k, pos.v, segment_ / kBlocksPerSegment);
  out.init(in_.q_heads, c.D);
  w.impl->s.resize(static_cast<size_t>(in_.q_heads * (c.block + 8)));
  const Member m{&c, pos.fast, pos.t + 1, &out, w.impl->s.data(), pos.begin};
  run_segment({&m, 1}, s * segment_, segment_, w.impl->scratch);
}

void CausalAttention::finish(const Position& pos, int64_t p, const Partial& acc, float* out) const {
  const int64_t D = in_.k.dim, nq = in_.q_heads / in_.k.heads;
  // The fast path leaves per-channel fp8 value scales for the end (the portable path applied them).
  bool cf_left = pos.v.kind == SchemeKind::Fp8 && pos.v.gran == Granularity::Channel && pos.fast;
  // fp8 values in the int8 mode's bf16 dot products carry 2^-kFp8OShift.
  float of =
      pos.fast && path().bf16dot && fp8_bf16_side(in_.int_mode, pos.v) ? pow2(kFp8OShift) : 1.0f;
  const Partial* a = &acc;
  Partial all;
  if (sinks_ > 0) {  // the sinks come first: fold the rest (its channel scales applied) after them
    Partial rest = acc;
    if (cf_left || of != 1.0f)
      for (int64_t j = 0; j < in_.q_heads; ++j)
        for (int64_t d = 0; d < D; ++d)
          rest.o[static_cast<size_t>(j * D + d)] *=
              (cf_left ? pos.v.fp8_scales[(j / nq) * D + d] : 1.0f) * of;
    cf_left = false;
    of = 1.0f;
    all = sink_partial(sink_only_ + p);
    fold(all, rest, false, D);
    a = &all;
  }
  float* o = out + (sink_only_ + p) * in_.q_heads * D;
  for (int64_t j = 0; j < in_.q_heads; ++j) {
    const float inv = 1.0f / a->l[static_cast<size_t>(j)];
    const float* cf = cf_left ? pos.v.fp8_scales + (j / nq) * D : nullptr;
    for (int64_t d = 0; d < D; ++d)
      o[j * D + d] = a->o[static_cast<size_t>(j * D + d)] * (inv * (cf ? cf[d] : 1.0f) * of);
  }
}

void CausalAttention::run(int64_t item, float* out, Workspace& w) {
  if (parts_) {  // one segment of one position
    const auto it = std::upper_bound(first_item_.begin(), first_item_.end(), item) - 1;
    const int64_t p = it - first_item_.begin();
    segment(position(p), p, item - *it, parts_->p[static_cast<size_t>(item)], w);
    return;
  }
  // A tile of positions [lo, hi), the longest first. Each position runs exactly the blocks, in
  // exactly the order, it runs alone (segment by segment, block by block, folded in order); the
  // tile only interleaves positions block by block and head by head, so each head's K/V block is
  // read from memory once and reused from cache by the other positions.
  const int64_t hi = in_.n - item * tile_, lo = std::max<int64_t>(0, hi - tile_), m = hi - lo;
  const int64_t D = in_.k.dim, block = segment_ / kBlocksPerSegment;
  std::vector<Position> pos;
  std::vector<Call> calls;
  std::vector<Member> members;
  pos.reserve(static_cast<size_t>(m));
  calls.reserve(static_cast<size_t>(m));
  auto& acc = w.impl->acc;
  auto& part = w.impl->part;
  if (static_cast<int64_t>(acc.size()) < m) {
    acc.resize(static_cast<size_t>(m));
    part.resize(static_cast<size_t>(m));
  }
  w.impl->s.resize(static_cast<size_t>(m * in_.q_heads * (block + 8)));
  for (int64_t x = 0; x < m; ++x) {
    pos.push_back(position(lo + x));
    calls.push_back(make_call(in_, lo + x, pos.back().k, pos.back().v, block));
    members.push_back({&calls.back(), pos.back().fast, pos.back().t + 1,
                       &part[static_cast<size_t>(x)],
                       w.impl->s.data() + x * in_.q_heads * (block + 8), pos.back().begin});
  }
  for (int64_t s = 0; s < segments(hi - 1); ++s) {
    for (int64_t x = 0; x < m; ++x)
      if (s < segments(lo + x)) part[static_cast<size_t>(x)].init(in_.q_heads, D);
    run_segment(members, s * segment_, segment_, w.impl->scratch);  // shorter ones skip the rest
    for (int64_t x = 0; x < m; ++x)
      if (s < segments(lo + x))
        fold(acc[static_cast<size_t>(x)], part[static_cast<size_t>(x)], s == 0, D);
  }
  for (int64_t x = 0; x < m; ++x)
    finish(pos[static_cast<size_t>(x)], lo + x, acc[static_cast<size_t>(x)], out);
}

void CausalAttention::merge(int64_t m, float* out) const {
  if (m < sink_only_) {  // a position before S: its sinks are all it reads
    const Partial P = sink_partial(m);
    float* o = out + m * q_heads_ * dim_;
    for (int64_t j = 0; j < q_heads_; ++j) {
      const float inv = 1.0f / P.l[static_cast<size_t>(j)];
      for (int64_t d = 0; d < dim_; ++d)
        o[j * dim_ + d] = P.o[static_cast<size_t>(j * dim_ + d)] * inv;
    }
    return;
  }
  const int64_t p = m - sink_only_;
  Partial acc;
  for (int64_t s = 0; s < segments(p); ++s)
    fold(acc, parts_->p[static_cast<size_t>(first_item_[static_cast<size_t>(p)] + s)], s == 0,
         in_.k.dim);
  finish(position(p), p, acc, out);
}

void set_l3_bytes(int64_t bytes) { l3_override() = bytes < 0 ? -1 : bytes; }

void causal_attention(const CausalInput& in, float* out, int threads) {
  const int nt = threads > 0 ? threads : omp_get_max_threads();
  CausalAttention a(in, nt);
  const int64_t items = a.items();
  // At least one thread (a call may have merges only: positions that read sinks alone).
  const int team =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(nt, std::max(items, a.merges()))));
#pragma omp parallel num_threads(team)
  {
    // Each thread's scratch kept from call to call (OpenMP keeps its threads), not reallocated.
    thread_local CausalAttention::Workspace w;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < items; ++i) a.run(i, out, w);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < a.merges(); ++p) a.merge(p, out);
  }
}

std::optional<IntMode> parse_int_mode(std::string_view name) {
  if (name == "exact") return IntMode::Exact;
  if (name == "int8") return IntMode::Int8;
  return std::nullopt;
}

bool has_fast_path(const StoredSide& k, const StoredSide& v, int64_t q_heads) {
  const int64_t nq = k.heads > 0 ? q_heads / k.heads : 0;
  return path().avx2 && k.dim % 8 == 0 && nq >= 1 && nq <= 8 && side_fast(k, true) &&
         side_fast(v, false);
}

void decode_attention(const float* q, int64_t q_heads, const StoredSide& k, const StoredSide& v,
                      float* out, const DecodeOptions& opt) {
  CausalInput in;  // CausalAttention checks the sides
  in.q = q;
  in.n = 1;
  in.q_heads = q_heads;
  in.t_begin = k.tokens - 1;
  in.k = k;
  in.v = v;
  in.int_mode = opt.int_mode;
  in.working_set = opt.working_set;
  causal_attention(in, out, opt.threads);
}

}  // namespace kvq::cpu
