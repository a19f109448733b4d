#include "reference_cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "reference_cpu/dense_ops.h"
#include "reference_cpu/reads.h"

namespace kvq {
namespace {

// Tokens per block of the decode loop: a multiple of every group size (G <= 256).
constexpr int64_t kBlock = 256;

void check_shapes(int64_t q_heads, const SideStore& k, const SideStore& v) {
  KVQ_CHECK(k.heads() == v.heads() && k.dim() == v.dim() && k.tokens() == v.tokens(),
            "attention: K cache [{}, {}, {}] and V cache [{}, {}, {}] differ", k.tokens(),
            k.heads(), k.dim(), v.tokens(), v.heads(), v.dim());
  KVQ_CHECK(k.heads() > 0 && q_heads > 0 && q_heads % k.heads() == 0,
            "attention: {} query heads is not a multiple of {} kv heads", q_heads, k.heads());
  KVQ_CHECK(k.tokens() > 0, "attention: the cache is empty");
}

// In place: row of n scores -> softmax probabilities (max-subtracted, sum in double).
void softmax_row(float* s, int64_t n) {
  float mx = -INFINITY;
  for (int64_t t = 0; t < n; ++t) mx = std::max(mx, s[t]);
  double sum = 0;
  for (int64_t t = 0; t < n; ++t) {
    s[t] = std::exp(s[t] - mx);
    sum += s[t];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t t = 0; t < n; ++t) s[t] *= inv;
}

}  // namespace

// Token-major decode (flash-decoding on the CPU): every cache layout is token-major, so each
// thread streams one contiguous slice of the context through all heads - sequential memory
// traffic instead of one strided pass per head. Pass 1 writes scores for the slice, pass 2 takes
// the softmax of each (head, query) row over the whole context, pass 3 accumulates the slice's
// values into a per-thread output that is summed at the end.
void decode_attention(const float* q, int64_t q_heads, const SideStore& k, const SideStore& v,
                      float* out, int threads, int64_t t_end) {
  check_shapes(q_heads, k, v);
  KVQ_CHECK(t_end <= k.tokens() && t_end != 0, "decode_attention: t_end {} outside [1, {}]", t_end,
            k.tokens());
  const int64_t H = k.heads(), D = k.dim(), T = t_end > 0 ? t_end : k.tokens();
  const int nq = static_cast<int>(q_heads / H);
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(D));
  const int nt = static_cast<int>(
      std::min<int64_t>(threads > 0 ? threads : omp_get_max_threads(), (T + kBlock - 1) / kBlock));
  std::vector<float> s(static_cast<size_t>(q_heads * T));
  std::vector<float> partial(static_cast<size_t>(nt * q_heads * D), 0.0f);
  // Slices are whole blocks (multiples of 256 tokens, so of every group size G).
  const int64_t blocks = (T + kBlock - 1) / kBlock;
#pragma omp parallel num_threads(nt)
  {
    const int me = omp_get_thread_num();
    const int64_t b0 = blocks * me / nt, b1 = blocks * (me + 1) / nt;
    const int64_t a = b0 * kBlock, b = std::min(T, b1 * kBlock);
    for (int64_t t0 = a; t0 < b; t0 += kBlock) {
      const int64_t t1 = std::min(b, t0 + kBlock);
      for (int64_t h = 0; h < H; ++h)
        side_dot(k, h, q + h * nq * D, nq, t0, t1, s.data() + h * nq * T + t0, T);
    }
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t r = 0; r < q_heads; ++r) {
      float* row = s.data() + r * T;
      for (int64_t t = 0; t < T; ++t) row[t] *= inv_sqrt_d;
      softmax_row(row, T);
    }
    float* o = partial.data() + me * q_heads * D;
    for (int64_t t0 = a; t0 < b; t0 += kBlock) {
      const int64_t t1 = std::min(b, t0 + kBlock);
      for (int64_t h = 0; h < H; ++h)
        side_accumulate(v, h, s.data() + h * nq * T + t0, nq, t0, t1, T, o + h * nq * D);
    }
  }
  for (int64_t i = 0; i < q_heads * D; ++i) {
    float acc = 0;
    for (int th = 0; th < nt; ++th) acc += partial[static_cast<size_t>(th * q_heads * D + i)];
    out[i] = acc;
  }
}

void causal_attention_check(int64_t n, int64_t q_heads, int64_t t_begin, const SideStore& k,
                            const SideStore& v, ExactTail k_exact, ExactTail v_exact) {
  check_shapes(q_heads, k, v);
  KVQ_CHECK(k.tokens() == t_begin + n,
            "causal_attention: the cache holds {} tokens, expected {} + {}", k.tokens(), t_begin,
            n);
  KVQ_CHECK(n > 0 && k_exact.begin <= k.quantized_tokens_at(t_begin + 1) &&
                v_exact.begin <= v.quantized_tokens_at(t_begin + 1),
            "causal_attention: exact tails start at {} / {}, after the window of position {}",
            k_exact.begin, v_exact.begin, t_begin);
}

void causal_attention_item(const float* q, int64_t q_heads, int64_t t_begin, const SideStore& k,
                           const SideStore& v, ExactTail k_exact, ExactTail v_exact, float* out,
                           int64_t item, std::vector<float>& s, int64_t window) {
  const int64_t H = k.heads(), D = k.dim();
  const int64_t r = item / H, h = item % H;
  const int nq = static_cast<int>(q_heads / H);
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t len = t_begin + r + 1;
  if (s.size() < static_cast<size_t>(nq * len)) s.resize(static_cast<size_t>(nq * len));
  const int64_t qk = k.quantized_tokens_at(len), qv = v.quantized_tokens_at(len);
  const float* qh = q + (r * q_heads + h * nq) * D;
  float* oh = out + (r * q_heads + h * nq) * D;
  // Scores: codes below qk, exact above (the exact tail indexed from its own start).
  side_dot(k, h, qh, nq, 0, qk, s.data(), len);
  dense_dot(k_exact.data - k_exact.begin * H * D, H, D, h, qh, nq, qk, len, s.data() + qk, len);
  for (int i = 0; i < nq; ++i) {
    float* row = s.data() + i * len;
    for (int64_t t = 0; t < len; ++t) row[t] *= inv_sqrt_d;
    if (window > 0)  // a sliding window: tokens older than it get probability 0
      std::fill(row, row + std::max<int64_t>(0, len - window), -INFINITY);
    softmax_row(row, len);
  }
  std::fill(oh, oh + nq * D, 0.0f);
  side_accumulate(v, h, s.data(), nq, 0, qv, len, oh);
  dense_accumulate(v_exact.data - v_exact.begin * H * D, H, D, h, s.data() + qv, nq, qv, len, len,
                   oh);
}

void causal_attention(const float* q, int64_t n, int64_t q_heads, int64_t t_begin,
                      const SideStore& k, const SideStore& v, ExactTail k_exact, ExactTail v_exact,
                      float* out, int threads, int64_t window) {
  causal_attention_check(n, q_heads, t_begin, k, v, k_exact, v_exact);
  const int64_t items = n * k.heads();
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
  {
    std::vector<float> s;
#pragma omp for schedule(dynamic, 4)
    for (int64_t it = 0; it < items; ++it)
      causal_attention_item(q, q_heads, t_begin, k, v, k_exact, v_exact, out, it, s, window);
  }
}

void prefill_attention(const float* q, int64_t q_heads, const SideStore& k, const SideStore& v,
                       const Tensor3& k_raw, const Tensor3& v_raw, float* out, int threads) {
  const int64_t T = k.tokens();
  KVQ_CHECK(k_raw.shape == (Shape3{T, k.heads(), k.dim()}) && v_raw.shape == k_raw.shape,
            "prefill_attention: raw K/V must be [{}, {}, {}] like the cache", T, k.heads(),
            k.dim());
  causal_attention(q, T, q_heads, 0, k, v, {k_raw.data.data(), 0}, {v_raw.data.data(), 0}, out,
                   threads);
}

std::vector<double> attention_probs(const float* q, int64_t q_heads, const SideStore& k) {
  const int64_t H = k.heads(), D = k.dim(), T = k.tokens();
  KVQ_CHECK(q_heads % H == 0, "attention: {} query heads is not a multiple of {} kv heads", q_heads,
            H);
  const int nq = static_cast<int>(q_heads / H);
  std::vector<double> p(static_cast<size_t>(q_heads * T));
  std::vector<float> s(static_cast<size_t>(nq * T));
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(D));
  for (int64_t h = 0; h < H; ++h) {
    side_dot(k, h, q + h * nq * D, nq, 0, T, s.data(), T);
    for (int i = 0; i < nq; ++i) {
      float* row = s.data() + i * T;
      for (int64_t t = 0; t < T; ++t) row[t] *= inv_sqrt_d;
      const double mx = *std::max_element(row, row + T);
      double sum = 0;
      double* pr = p.data() + (h * nq + i) * T;
      for (int64_t t = 0; t < T; ++t) sum += pr[t] = std::exp(static_cast<double>(row[t]) - mx);
      for (int64_t t = 0; t < T; ++t) pr[t] /= sum;
    }
  }
  return p;
}

AttentionMetrics attention_metrics(const float* q, int64_t q_heads, const SideStore& k_ref,
                                   const SideStore& v_ref, const SideStore& k, const SideStore& v,
                                   int topk) {
  const int64_t T = k.tokens(), D = k.dim();
  KVQ_CHECK(k_ref.tokens() == T, "attention_metrics: caches hold {} and {} tokens", k_ref.tokens(),
            T);
  const auto pr = attention_probs(q, q_heads, k_ref), pq = attention_probs(q, q_heads, k);
  AttentionMetrics m;
  const int64_t kk = std::min<int64_t>(topk, T);
  std::vector<int64_t> ia(static_cast<size_t>(T)), ib(static_cast<size_t>(T));
  for (int64_t j = 0; j < q_heads; ++j) {
    const double* a = pr.data() + j * T;
    const double* b = pq.data() + j * T;
    double kl = 0;
    for (int64_t t = 0; t < T; ++t)
      if (a[t] > 0) kl += a[t] * (std::log(a[t]) - std::log(std::max(b[t], 1e-300)));
    m.kl += kl / static_cast<double>(q_heads);
    std::iota(ia.begin(), ia.end(), 0);
    std::iota(ib.begin(), ib.end(), 0);
    auto by = [](const double* p) {
      return [p](int64_t x, int64_t y) { return p[x] > p[y] || (p[x] == p[y] && x < y); };
    };
    std::partial_sort(ia.begin(), ia.begin() + kk, ia.end(), by(a));
    std::partial_sort(ib.begin(), ib.begin() + kk, ib.end(), by(b));
    std::sort(ia.begin(), ia.begin() + kk);
    std::sort(ib.begin(), ib.begin() + kk);
    std::vector<int64_t> common;
    std::set_intersection(ia.begin(), ia.begin() + kk, ib.begin(), ib.begin() + kk,
                          std::back_inserter(common));
    m.topk_overlap +=
        static_cast<double>(common.size()) / static_cast<double>(kk) / static_cast<double>(q_heads);
  }
  std::vector<float> o_ref(static_cast<size_t>(q_heads * D)), o(o_ref.size());
  decode_attention(q, q_heads, k_ref, v_ref, o_ref.data());
  decode_attention(q, q_heads, k, v, o.data());
  double se = 0, sr = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    se += (static_cast<double>(o[i]) - o_ref[i]) * (static_cast<double>(o[i]) - o_ref[i]);
    sr += static_cast<double>(o_ref[i]) * o_ref[i];
  }
  m.output_nmse = sr > 0 ? se / sr : 0;
  return m;
}

}  // namespace kvq
