#include "reference_cpu/llama.h"

#include <omp.h>

#include <cmath>

#include "core/error.h"
#include "reference_cpu/attention.h"
#include "reference_cpu/matmul.h"

namespace kvq {

using gguf::GgufFile;
namespace {

using gguf::GgufFile;
using gguf::TensorInfo;

using Mat = LlamaModel::Mat;

Mat load_matrix(const GgufFile& f, const std::string& name, int64_t rows, int64_t cols) {
  const TensorInfo& t = f.tensor(name);
  KVQ_CHECK(t.dims.size() == 2 && t.dims[0] == cols && t.dims[1] == rows,
            "{}: tensor {} has dims [{}], expected [{}, {}]", f.name(), name,
            fmt::format("{}", fmt::join(t.dims, ", ")), cols, rows);
  const std::vector<float> v = f.dequantize(t);  // memory order: dims[0] (= cols) fastest
  return Eigen::Map<const Mat>(v.data(), rows, cols);
}

// A [rows=out, cols=in] weight as a transposed [in][out] Linear.
LlamaModel::Linear transposed(const Mat& w) {
  LlamaModel::Linear l;
  l.out = w.rows();
  l.in = w.cols();
  l.wt.resize(static_cast<size_t>(l.in * l.out));
  Eigen::Map<Mat>(l.wt.data(), l.in, l.out) = w.transpose();
  return l;
}

// y [n, out] = x [n, in] * W^T (or += when accumulate).
void apply(const LlamaModel::Linear& l, const Mat& x, Mat& y, bool accumulate = false) {
  if (!accumulate) y.resize(x.rows(), l.out);
  matmul(x.data(), x.rows(), l.in, l.wt.data(), l.out, y.data(), accumulate);
}

Eigen::VectorXf load_vector(const GgufFile& f, const std::string& name, int64_t n) {
  const TensorInfo& t = f.tensor(name);
  KVQ_CHECK(t.nelements == n, "{}: tensor {} has {} elements, expected {}", f.name(), name, t.nelements, n);
  const std::vector<float> v = f.dequantize(t);
  return Eigen::Map<const Eigen::VectorXf>(v.data(), n);
}

// Rows of x [n, d] normalized by RMS and scaled by w.
Mat rms_norm(const Mat& x, const Eigen::VectorXf& w, float eps) {
  Mat y(x.rows(), x.cols());
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    const float ms = x.row(r).squaredNorm() / static_cast<float>(x.cols());
    y.row(r) = x.row(r).cwiseProduct(w.transpose()) * (1.0f / std::sqrt(ms + eps));
  }
  return y;
}

}  // namespace

LlamaCache::LlamaCache(const LlamaConfig& c, const CacheOptions& o) : opts_(o) {
  for (int l = 0; l < c.layers; ++l)
    layers_.push_back({make_side(o.spec, Role::Key, c.kv_heads, c.head_dim, l),
                       make_side(o.spec, Role::Value, c.kv_heads, c.head_dim, l)});
}

double LlamaCache::bytes() const {
  double b = 0;
  for (const auto& l : layers_) b += l.k->footprint().total_bytes() + l.v->footprint().total_bytes();
  return b;
}

LlamaModel LlamaModel::load(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture");
  KVQ_CHECK(arch == "llama", "{}: architecture '{}' is not supported (only llama)", f.name(), arch);
  LlamaModel m;
  LlamaConfig& c = m.cfg_;
  c.layers = static_cast<int>(f.get_u32("llama.block_count"));
  c.hidden = static_cast<int>(f.get_u32("llama.embedding_length"));
  c.heads = static_cast<int>(f.get_u32("llama.attention.head_count"));
  c.kv_heads = static_cast<int>(f.get_u32("llama.attention.head_count_kv"));
  c.ffn = static_cast<int>(f.get_u32("llama.feed_forward_length"));
  c.context = static_cast<int>(f.get_u32("llama.context_length"));
  c.rms_eps = f.get_f32("llama.attention.layer_norm_rms_epsilon");
  c.rope_theta = f.has("llama.rope.freq_base") ? f.get_f32("llama.rope.freq_base") : 10000.0f;
  KVQ_CHECK(c.heads > 0 && c.kv_heads > 0 && c.hidden % c.heads == 0 && c.heads % c.kv_heads == 0,
            "{}: inconsistent head counts ({} heads, {} kv heads, hidden {})", f.name(), c.heads,
            c.kv_heads, c.hidden);
  c.head_dim = c.hidden / c.heads;
  const TensorInfo& emb = f.tensor("token_embd.weight");
  KVQ_CHECK(emb.dims.size() == 2 && emb.dims[0] == c.hidden, "{}: token_embd.weight dims do not match hidden {}",
            f.name(), c.hidden);
  c.vocab = static_cast<int>(emb.dims[1]);
  m.embed_ = load_matrix(f, "token_embd.weight", c.vocab, c.hidden);
  m.head_ = transposed(f.find_tensor("output.weight") ? load_matrix(f, "output.weight", c.vocab, c.hidden) : m.embed_);
  m.out_norm_ = load_vector(f, "output_norm.weight", c.hidden);
  const int64_t kvd = static_cast<int64_t>(c.kv_heads) * c.head_dim;
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Block b;
    b.attn_norm = load_vector(f, p + "attn_norm.weight", c.hidden);
    b.ffn_norm = load_vector(f, p + "ffn_norm.weight", c.hidden);
    b.wq = transposed(load_matrix(f, p + "attn_q.weight", c.hidden, c.hidden));
    b.wk = transposed(load_matrix(f, p + "attn_k.weight", kvd, c.hidden));
    b.wv = transposed(load_matrix(f, p + "attn_v.weight", kvd, c.hidden));
    b.wo = transposed(load_matrix(f, p + "attn_output.weight", c.hidden, c.hidden));
    b.w_gate = transposed(load_matrix(f, p + "ffn_gate.weight", c.ffn, c.hidden));
    b.w_up = transposed(load_matrix(f, p + "ffn_up.weight", c.ffn, c.hidden));
    b.w_down = transposed(load_matrix(f, p + "ffn_down.weight", c.hidden, c.ffn));
    m.blocks_.push_back(std::move(b));
  }
  for (int i = 0; i < c.head_dim / 2; ++i)
    m.inv_freq_.push_back(static_cast<float>(
        std::pow(static_cast<double>(c.rope_theta), -2.0 * i / static_cast<double>(c.head_dim))));
  return m;
}

void LlamaModel::rope(float* x, int64_t n, int64_t heads, int64_t pos0, float sign) const {
  const int64_t D = cfg_.head_dim;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < D / 2; ++i) {
      const double a = static_cast<double>(pos0 + t) * inv_freq_[static_cast<size_t>(i)];
      const float cs = static_cast<float>(std::cos(a)), sn = sign * static_cast<float>(std::sin(a));
      for (int64_t h = 0; h < heads; ++h) {
        float* p = x + (t * heads + h) * D + 2 * i;
        const float x0 = p[0], x1 = p[1];
        p[0] = x0 * cs - x1 * sn;
        p[1] = x0 * sn + x1 * cs;
      }
    }
}

void LlamaModel::forward(std::span<const int32_t> tokens, LlamaCache& cache, std::vector<float>& logits,
                         bool all_logits, int threads, const KvObserver& observe) const {
  const LlamaConfig& c = cfg_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  KVQ_CHECK(n > 0, "forward: no tokens");
  const int64_t pos0 = cache.tokens();
  const int nt = threads > 0 ? threads : omp_get_num_procs();
  omp_set_num_threads(nt);  // kvq::matmul and the attention regions
  Mat x(n, c.hidden);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = tokens[static_cast<size_t>(t)];
    KVQ_CHECK(id >= 0 && id < c.vocab, "forward: token id {} outside the vocabulary [0, {})", id, c.vocab);
    x.row(t) = embed_.row(id);
  }
  const int64_t H = c.kv_heads, D = c.head_dim, kvd = H * D;
  const bool pre = cache.options().pre_rope;
  std::vector<float> ktail, vtail, attn(static_cast<size_t>(n * c.hidden));
  for (int l = 0; l < c.layers; ++l) {
    const Block& b = blocks_[static_cast<size_t>(l)];
    auto& side = cache.layers()[static_cast<size_t>(l)];
    const Mat xn = rms_norm(x, b.attn_norm, c.rms_eps);
    Mat q, k, v;
    apply(b.wq, xn, q);
    apply(b.wk, xn, k);
    apply(b.wv, xn, v);
    rope(q.data(), n, c.heads, pos0);
    Mat k_pre;
    if (pre || observe) k_pre = k;
    rope(k.data(), n, H, pos0);
    if (observe) observe(l, pos0, n, k_pre.data(), k.data(), v.data());
    // Exact values the new positions may need: the cache's window before the append + the chunk.
    ktail.clear();
    vtail.clear();
    side.k->exact_tail(ktail);
    side.v->exact_tail(vtail);
    const int64_t kbeg = pos0 - static_cast<int64_t>(ktail.size()) / kvd;
    const int64_t vbeg = pos0 - static_cast<int64_t>(vtail.size()) / kvd;
    if (pre) rope(ktail.data(), pos0 - kbeg, H, kbeg);  // the stored window is pre-RoPE
    ktail.insert(ktail.end(), k.data(), k.data() + n * kvd);
    vtail.insert(vtail.end(), v.data(), v.data() + n * kvd);
    side.k->append(pre ? k_pre.data() : k.data(), n);
    side.v->append(v.data(), n);
    if (!pre) {
      causal_attention(q.data(), n, c.heads, pos0, *side.k, *side.v, {ktail.data(), kbeg},
                       {vtail.data(), vbeg}, attn.data(), nt);
    } else {
      // Pre-RoPE keys: read the stored (quantized) keys back, rotate them to their positions,
      // and attend over that; the exact tail was captured post-RoPE above.
      Tensor3 kr = side.k->dequantize();
      rope(kr.data.data(), kr.shape.tokens, H, 0);
      auto view = make_view(*side.k, std::move(kr));
      causal_attention(q.data(), n, c.heads, pos0, *view, *side.v, {ktail.data(), kbeg},
                       {vtail.data(), vbeg}, attn.data(), nt);
    }
    const Mat a = Eigen::Map<const Mat>(attn.data(), n, c.hidden);
    apply(b.wo, a, x, true);
    const Mat hn = rms_norm(x, b.ffn_norm, c.rms_eps);
    Mat g, u;
    apply(b.w_gate, hn, g);
    apply(b.w_up, hn, u);
    g = g.unaryExpr([](float z) { return z / (1.0f + std::exp(-z)); }).cwiseProduct(u);
    apply(b.w_down, g, x, true);
  }
  const Mat y = rms_norm(all_logits ? Mat(x) : Mat(x.bottomRows(1)), out_norm_, c.rms_eps);
  logits.resize(static_cast<size_t>(y.rows() * c.vocab));
  matmul(y.data(), y.rows(), head_.in, head_.wt.data(), head_.out, logits.data());
}

}  // namespace kvq
