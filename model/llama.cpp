#include "model/llama.h"

#include <omp.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <map>

#include "core/error.h"
#include "fp8/format.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/kivi.h"
#include "reference_cpu/attention.h"
#include "reference_cpu/matmul.h"

namespace kvq {

using gguf::GgufFile;
namespace {

using gguf::GgufFile;
using gguf::TensorInfo;

using Mat = LlamaModel::Mat;

const TensorInfo& matrix_info(const GgufFile& f, const std::string& name, int64_t rows,
                              int64_t cols) {
  const TensorInfo& t = f.tensor(name);
  KVQ_CHECK(t.dims.size() == 2 && t.dims[0] == cols && t.dims[1] == rows,
            "{}: tensor {} has dims [{}], expected [{}, {}]", f.name(), name,
            fmt::format("{}", fmt::join(t.dims, ", ")), cols, rows);
  return t;
}

// W [rows = out][cols = in] from the file, held as `store` says.
LlamaModel::Linear load_linear(const GgufFile& f, const std::string& name, int64_t rows,
                               int64_t cols, WeightStore store) {
  const TensorInfo& t = matrix_info(f, name, rows, cols);
  LlamaModel::Linear l;
  l.out = rows;
  l.in = cols;
  if (store != WeightStore::kFp32) {  // a GGUF's blocks are packed (kMapped: as kPacked)
    l.packed = PackedMatrix::from_gguf(f, t);
  } else {
    const std::vector<float> v = f.dequantize(t);  // memory order: dims[0] (= cols) fastest
    l.wt.resize(static_cast<size_t>(l.in * l.out));
    Eigen::Map<Mat>(l.wt.data(), l.in, l.out) =
        Eigen::Map<const Mat>(v.data(), rows, cols).transpose();
  }
  return l;
}

Eigen::VectorXf load_vector(const GgufFile& f, const std::string& name, int64_t n) {
  const TensorInfo& t = f.tensor(name);
  KVQ_CHECK(t.nelements == n, "{}: tensor {} has {} elements, expected {}", f.name(), name,
            t.nelements, n);
  const std::vector<float> v = f.dequantize(t);
  return Eigen::Map<const Eigen::VectorXf>(v.data(), n);
}

// Rows [r0, r1) of x [n, d] normalized by RMS and scaled by w, into y (already [n, d]).
void rms_norm_rows(const Mat& x, const Eigen::VectorXf& w, float eps, Mat& y, Eigen::Index r0,
                   Eigen::Index r1) {
  for (Eigen::Index r = r0; r < r1; ++r) {
    const float ms = x.row(r).squaredNorm() / static_cast<float>(x.cols());
    y.row(r) = x.row(r).cwiseProduct(w.transpose()) * (1.0f / std::sqrt(ms + eps));
  }
}

// A GGUF's tensors by role (model/arch.h's names).
struct GgufSource {
  const GgufFile& f;
  const ArchEntry& a;
  std::string name(TensorRole r, int l) const { return tensor_name(a, r, l, false); }
  bool has(TensorRole r, int l) const { return f.find_tensor(name(r, l)) != nullptr; }
  LlamaModel::Linear matrix(TensorRole r, int l, int64_t rows, int64_t cols,
                            WeightStore store) const {
    return load_linear(f, name(r, l), rows, cols, store);
  }
  Eigen::VectorXf vector(TensorRole r, int l, int64_t n) const {
    return load_vector(f, name(r, l), n);
  }
};

gguf::GgmlType dense_type(const std::string& dtype) {
  return dtype == "F32"   ? gguf::GgmlType::kF32
         : dtype == "F16" ? gguf::GgmlType::kF16
                          : gguf::GgmlType::kBF16;
}

// A checkpoint folder's tensors by role, read in place from the mapped shards.
struct HfSource {
  const HfCheckpoint& c;
  const ArchEntry& a;
  std::string name(TensorRole r, int l) const { return tensor_name(a, r, l, true); }
  bool has(TensorRole r, int l) const { return c.find(name(r, l)) != nullptr; }

  const SafetensorsEntry& entry(const std::string& n, std::vector<int64_t> shape) const {
    const SafetensorsEntry& e = c.tensor(n);
    KVQ_CHECK(e.shape == shape, "{}: tensor {} has shape [{}], expected [{}]", c.file_of(e), n,
              fmt::join(e.shape, ", "), fmt::join(shape, ", "));
    return e;
  }
  // Every value of `e` as float, row-major; F8_E4M3 times its weight_scale(_inv).
  std::vector<float> values(const std::string& n, const SafetensorsEntry& e) const {
    int64_t count = 1;
    for (int64_t d : e.shape) count *= d;
    std::vector<float> v(static_cast<size_t>(count));
    const uint8_t* p = c.data(e);
    if (e.dtype == "F32" || e.dtype == "F16" || e.dtype == "BF16") {
      gguf::dequantize_row(dense_type(e.dtype), p, count, v.data());
      return v;
    }
    KVQ_CHECK(e.dtype == "F8_E4M3",
              "{}: tensor {} has dtype {}; kvq reads F32, F16, BF16 and F8_E4M3 (with its "
              "weight_scale or weight_scale_inv)",
              c.file_of(e), n, e.dtype);
    const std::string base = n.size() > 7 && n.ends_with(".weight") ? n : n + ".weight";
    const SafetensorsEntry* s = c.find(base + "_scale_inv");
    if (!s) s = c.find(base + "_scale");
    KVQ_CHECK(s && e.shape.size() == 2,
              "{}: tensor {} is an F8_E4M3 matrix without {}_scale_inv or {}_scale", c.file_of(e),
              n, base, base);
    const std::vector<float> sc = values(s->name, *s);
    const int64_t rows = e.shape[0], cols = e.shape[1];
    const auto [br, bc] = c.fp8_block();
    const int64_t sr = (rows + br - 1) / br, scc = (cols + bc - 1) / bc;
    const int64_t ns = static_cast<int64_t>(sc.size());
    const bool block = s->shape.size() == 2 && s->shape[0] == sr && s->shape[1] == scc;
    KVQ_CHECK(ns == 1 || ns == rows || block,
              "{}: scale {} has shape [{}]; expected one value, one per row ({}) or one per "
              "{}x{} block ([{}, {}])",
              c.file_of(*s), s->name, fmt::join(s->shape, ", "), rows, br, bc, sr, scc);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) {
        const float f = ns == 1 ? sc[0]
                        : block ? sc[static_cast<size_t>((r / br) * scc + k / bc)]
                                : sc[static_cast<size_t>(r)];
        float& x = v[static_cast<size_t>(r * cols + k)];
        x = fp8::decode<Fp8Format::E4M3>(p[r * cols + k]) * f;
      }
    return v;
  }
  LlamaModel::Linear matrix(TensorRole r, int l, int64_t rows, int64_t cols,
                            WeightStore store) const {
    const std::string n = name(r, l);
    const SafetensorsEntry& e = entry(n, {rows, cols});
    LlamaModel::Linear lin;
    lin.out = rows;
    lin.in = cols;
    const bool dense = e.dtype == "F32" || e.dtype == "F16" || e.dtype == "BF16";
    if (store == WeightStore::kMapped && dense) {  // multiplied where it lies: nothing copied
      lin.packed =
          PackedMatrix::from_mapped(c.data(e), dense_type(e.dtype), rows, cols, c.owner(e));
      return lin;
    }
    if (store == WeightStore::kPacked && dense) {
      lin.packed = PackedMatrix::from_dense(c.data(e), dense_type(e.dtype), rows, cols);
      c.release(e);  // packed: its mapped pages may go (peak memory ~ the panels, not 2x)
      return lin;
    }
    const std::vector<float> w = values(n, e);
    c.release(e);
    if (store != WeightStore::kFp32) {
      lin.packed = PackedMatrix::from_rows(w.data(), rows, cols);
    } else {
      lin.wt.resize(static_cast<size_t>(rows * cols));
      Eigen::Map<Mat>(lin.wt.data(), cols, rows) =
          Eigen::Map<const Mat>(w.data(), rows, cols).transpose();
    }
    return lin;
  }
  Eigen::VectorXf vector(TensorRole r, int l, int64_t n) const {
    const std::string nm = name(r, l);
    const std::vector<float> v = values(nm, entry(nm, {n}));
    return Eigen::Map<const Eigen::VectorXf>(v.data(), n);
  }
};

// Rows [r0, r1) of x [n, heads * D]: each head's D channels RMS-normalized and scaled by w [D]
// (qwen3's q_norm / k_norm), in place.
void rms_norm_heads(Mat& x, const Eigen::VectorXf& w, float eps, Eigen::Index r0, Eigen::Index r1) {
  const Eigen::Index D = w.size();
  for (Eigen::Index r = r0; r < r1; ++r)
    for (Eigen::Index h = 0; h < x.cols() / D; ++h) {
      auto seg = x.row(r).segment(h * D, D);
      const float ms = seg.squaredNorm() / static_cast<float>(D);
      seg = seg.cwiseProduct(w.transpose()) * (1.0f / std::sqrt(ms + eps));
    }
}

}  // namespace

LlamaCache::LlamaCache(const LlamaConfig& c, const CacheOptions& o) : opts_(o) {
  opts_.spec = resolve_layers(o.spec, c.layers, "the model");  // @first=/@last= name layers now
  // Appends quantize on backend cpu's kernels whatever the attention backend: the bytes are the
  // reference's, bit for bit (tests/kernels/cpu/side_kernels_test.cpp).
  const SideKernels k = cpu_side_kernels();
  for (int l = 0; l < c.layers; ++l) {
    layers_.push_back({make_side(opts_.spec, Role::Key, c.kv_heads, c.head_dim, l, k),  // layer l's
                       make_side(opts_.spec, Role::Value, c.kv_heads, c.head_dim, l, k)});
    // The model's whole context as address space: no copies as the cache grows (resident memory
    // stays the tokens written).
    layers_.back().k->reserve(c.context);
    layers_.back().v->reserve(c.context);
  }
}

double LlamaCache::bytes() const {
  double b = 0;
  for (const auto& l : layers_)
    b += l.k->footprint().total_bytes() + l.v->footprint().total_bytes();
  return b;
}

void check_cache_options(const CacheOptions& o, const LlamaConfig& c) {
  check_layers(o.spec, c.layers, "the model");
  for (const SchemeSpec& s : o.spec.distinct_layer_specs())
    for (Role r : {Role::Key, Role::Value})
      if (s.side(r).rot.on) (void)Rotation(s.side(r).rot, c.head_dim);  // throws if not
}

WeightStore parse_weight_store(const std::string& s) {
  for (WeightStore w : {WeightStore::kMapped, WeightStore::kPacked, WeightStore::kFp32})
    if (s == weight_store_name(w)) return w;
  fail("weights '{}' is not one of mapped, packed, fp32", s);
}

const char* weight_store_name(WeightStore s) {
  return s == WeightStore::kMapped ? "mapped" : s == WeightStore::kPacked ? "packed" : "fp32";
}

LlamaConfig LlamaModel::read_config(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture");
  // The GGUF families of the table (model/arch.h): llama's llama.* metadata today.
  const ArchEntry* entry = nullptr;
  for (const ArchEntry& a : architectures())
    if (a.gguf_arch && arch == a.gguf_arch) entry = &a;
  KVQ_CHECK(entry && arch == "llama",
            "{}: architecture '{}' is not supported (only llama); Mistral and Qwen load from a "
            "Hugging Face checkpoint folder",
            f.name(), arch);
  LlamaConfig c;
  c.family = entry->family;
  c.layers = static_cast<int>(f.get_u32("llama.block_count"));
  c.hidden = static_cast<int>(f.get_u32("llama.embedding_length"));
  c.heads = static_cast<int>(f.get_u32("llama.attention.head_count"));
  c.kv_heads = static_cast<int>(f.get_u32("llama.attention.head_count_kv"));
  c.ffn = static_cast<int>(f.get_u32("llama.feed_forward_length"));
  c.context = static_cast<int>(f.get_u32("llama.context_length"));
  c.rms_eps = f.get_f32("llama.attention.layer_norm_rms_epsilon");
  c.rope_theta = f.has("llama.rope.freq_base") ? f.get_f32("llama.rope.freq_base") : 10000.0f;
  for (const auto& [key, v] : {std::pair{"block_count", c.layers},
                               {"embedding_length", c.hidden},
                               {"feed_forward_length", c.ffn},
                               {"context_length", c.context}})
    KVQ_CHECK(v >= 1 && v <= (1 << 24), "{}: llama.{} = {} is outside [1, 16777216]", f.name(), key,
              v);
  KVQ_CHECK(c.heads > 0 && c.kv_heads > 0 && c.hidden % c.heads == 0 && c.heads % c.kv_heads == 0,
            "{}: inconsistent head counts ({} heads, {} kv heads, hidden {})", f.name(), c.heads,
            c.kv_heads, c.hidden);
  c.head_dim = c.hidden / c.heads;
  const TensorInfo& emb = f.tensor("token_embd.weight");
  KVQ_CHECK(emb.dims.size() == 2 && emb.dims[0] == c.hidden,
            "{}: token_embd.weight dims do not match hidden {}", f.name(), c.hidden);
  c.vocab = static_cast<int>(emb.dims[1]);
  c.tied = f.find_tensor("output.weight") == nullptr;
  return c;
}

template <class Source>
LlamaModel LlamaModel::load_from(const Source& src, const LlamaConfig& cfg, WeightStore store) {
  LlamaModel m;
  m.store_ = store;
  m.cfg_ = cfg;
  const LlamaConfig& c = m.cfg_;
  using R = TensorRole;
  m.head_ = src.matrix(c.tied ? R::kEmbed : R::kOutput, 0, c.vocab, c.hidden, store);
  if (!c.tied) m.embed_ = src.matrix(R::kEmbed, 0, c.vocab, c.hidden, store);
  m.out_norm_ = src.vector(R::kOutNorm, 0, c.hidden);
  const int64_t kvd = static_cast<int64_t>(c.kv_heads) * c.head_dim, qd = c.q_dim();
  for (int l = 0; l < c.layers; ++l) {
    Block b;
    b.attn_norm = src.vector(R::kAttnNorm, l, c.hidden);
    b.ffn_norm = src.vector(R::kFfnNorm, l, c.hidden);
    b.wq = src.matrix(R::kQ, l, qd, c.hidden, store);
    b.wk = src.matrix(R::kK, l, kvd, c.hidden, store);
    b.wv = src.matrix(R::kV, l, kvd, c.hidden, store);
    b.wo = src.matrix(R::kO, l, c.hidden, qd, store);
    b.w_gate = src.matrix(R::kGate, l, c.ffn, c.hidden, store);
    b.w_up = src.matrix(R::kUp, l, c.ffn, c.hidden, store);
    b.w_down = src.matrix(R::kDown, l, c.hidden, c.ffn, store);
    if (c.qkv_bias) {
      b.bq = src.vector(R::kQBias, l, qd);
      b.bk = src.vector(R::kKBias, l, kvd);
      b.bv = src.vector(R::kVBias, l, kvd);
    }
    if (c.o_bias) b.bo = src.vector(R::kOBias, l, c.hidden);
    if (c.qk_norm) {
      b.q_norm = src.vector(R::kQNorm, l, c.head_dim);
      b.k_norm = src.vector(R::kKNorm, l, c.head_dim);
    }
    m.blocks_.push_back(std::move(b));
  }
  m.inv_freq_ = rope_inv_freq(c);
  return m;
}

LlamaModel LlamaModel::load(const GgufFile& f, WeightStore store) {
  LlamaModel m = load_from(GgufSource{f, arch_entry("llama")}, read_config(f), store);
  // Llama 3.x GGUFs carry their rope scaling as per-frequency divisors (llama.cpp's freq_factors).
  if (const TensorInfo* t = f.find_tensor("rope_freqs.weight")) {
    const Eigen::VectorXf ff = load_vector(f, t->name, m.cfg_.head_dim / 2);
    for (size_t i = 0; i < m.inv_freq_.size(); ++i)
      m.inv_freq_[i] /= ff[static_cast<Eigen::Index>(i)];
  }
  return m;
}

LlamaModel LlamaModel::load(const HfCheckpoint& c, WeightStore store) {
  return load_from(HfSource{c, arch_entry(c.config().family)}, c.config(), store);
}

LlamaConfig LlamaModel::read_config(const std::string& path) {
  if (HfCheckpoint::is_folder(path)) return HfCheckpoint::open(path).config();
  return read_config(GgufFile::open(path));
}

LlamaModel LlamaModel::load(const std::string& path, WeightStore store) {
  if (HfCheckpoint::is_folder(path)) return load(HfCheckpoint::open(path), store);
  return load(GgufFile::open(path), store);
}

void LlamaModel::rope(float* x, int64_t n, int64_t heads, int64_t pos0, float sign) const {
  const int64_t D = cfg_.head_dim;
  // channel pair (a, b) of frequency i: (2i, 2i + 1) adjacent, (i, i + D/2) rotate_half
  const bool half = cfg_.rope_style == RopeStyle::kHalf;
  const int64_t step = half ? 1 : 2, other = half ? D / 2 : 1;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < D / 2; ++i) {
      const double a = static_cast<double>(pos0 + t) * inv_freq_[static_cast<size_t>(i)];
      const float cs = static_cast<float>(std::cos(a)), sn = sign * static_cast<float>(std::sin(a));
      for (int64_t h = 0; h < heads; ++h) {
        float* p = x + (t * heads + h) * D + step * i;
        const float x0 = p[0], x1 = p[other];
        p[0] = x0 * cs - x1 * sn;
        p[other] = x0 * sn + x1 * cs;
      }
    }
}

size_t LlamaModel::weight_bytes() const {
  auto bytes = [](const Linear& l) { return l.packed.bytes() + l.wt.size() * sizeof(float); };
  size_t b = bytes(head_) + (cfg_.tied ? 0 : bytes(embed_));
  for (const Block& k : blocks_)
    for (const Linear* l : {&k.wq, &k.wk, &k.wv, &k.wo, &k.w_gate, &k.w_up, &k.w_down})
      b += bytes(*l);
  return b;
}

std::string LlamaModel::weight_formats() const {
  if (store_ == WeightStore::kFp32) return "fp32 (reference store)";
  std::map<std::string, int> n;
  ++n[head_.packed.format()];
  if (!cfg_.tied) ++n[embed_.packed.format()];
  for (const Block& k : blocks_)
    for (const Linear* l : {&k.wq, &k.wk, &k.wv, &k.wo, &k.w_gate, &k.w_up, &k.w_down})
      ++n[l->packed.format()];
  std::string s;
  for (const auto& [f, count] : n) s += fmt::format("{}{} x {}", s.empty() ? "" : ", ", f, count);
  return s;
}

// Member `me` of a team of `members` threads computes its share of the product.
void LlamaModel::apply(const Linear& l, const float* x, int64_t n, float* y, bool accumulate,
                       int me, int members) const {
  if (store_ != WeightStore::kFp32) {
    l.packed.multiply(x, n, y, accumulate, me, members);
  } else if (me == 0) {  // the reference store: the plain product, on one member
    matmul(x, n, l.in, l.wt.data(), l.out, y, accumulate);
  }
}

void LlamaModel::embed(int32_t id, float* out) const {
  const Linear& e = cfg_.tied ? head_ : embed_;
  if (store_ != WeightStore::kFp32) {
    e.packed.weight_row(id, out);
  } else {
    for (int64_t k = 0; k < e.in; ++k) out[k] = e.wt[static_cast<size_t>(k * e.out + id)];
  }
}

void LlamaModel::forward(std::span<const int32_t> tokens, LlamaCache& cache,
                         std::vector<float>& logits, bool all_logits, int threads,
                         const KvObserver& observe) const {
  if (backend_ == AttentionBackend::kCuda)
    return forward_cuda(tokens, cache, logits, all_logits, observe);  // model/llama_cuda.cpp
  const LlamaConfig& c = cfg_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  KVQ_CHECK(n > 0, "forward: no tokens");
  KVQ_CHECK(cache.layers().size() == static_cast<size_t>(c.layers),
            "forward: the cache has {} layers, the model {}", cache.layers().size(), c.layers);
  const int64_t pos0 = cache.tokens();
  Mat x(n, c.hidden);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = tokens[static_cast<size_t>(t)];
    KVQ_CHECK(id >= 0 && id < c.vocab, "forward: token id {} outside the vocabulary [0, {})", id,
              c.vocab);
    embed(id, x.row(t).data());
  }
  const int64_t H = c.kv_heads, D = c.head_dim, kvd = H * D;
  const bool pre = cache.options().pre_rope;
  check_cache_options(cache.options(), c);
  const int64_t rows_out = all_logits ? n : 1;
  logits.resize(static_cast<size_t>(rows_out * c.vocab));
  const int64_t qd = c.q_dim();
  std::vector<float> ktail, vtail, attn(static_cast<size_t>(n * qd));
  Mat xn(n, c.hidden), q(n, qd), k(n, kvd), v(n, kvd), k_pre, g(n, c.ffn), u(n, c.ffn),
      y(rows_out, c.hidden);
  std::unique_ptr<SideStore> view;  // pre-RoPE keys rotated to their positions
  int64_t kbeg = 0, vbeg = 0;
  std::exception_ptr err;
  std::atomic<int64_t> next_item{0}, next_merge{0};
  std::unique_ptr<CausalCall> call;  // this layer's attention (kernels/backend.h)
  const std::lock_guard<std::mutex> lock(team_->mutex);
  // threads = 0: kvq chooses per pass between all cores and one (AutoThreads says why)
  const int cores = omp_get_num_procs();
  if (threads <= 0 && (!team_->chooser || team_->chooser->cores() != cores))
    team_->chooser = std::make_unique<AutoThreads>(cores);
  const int nt = threads > 0 ? threads : team_->chooser->next(n);
  std::unique_ptr<ThreadTeam>& slot = nt == 1 ? team_->solo : team_->team;
  if (!slot || slot->size() != nt) slot = std::make_unique<ThreadTeam>(nt);
  ThreadTeam& team = *slot;
  const auto started = std::chrono::steady_clock::now();
  // One team for the whole pass: the matrix products split their output panels and attention its
  // work items (kernels/cpu/attention.h's, or backend ref's (position, kv head) pairs) among the
  // members, each taken from a shared counter; the small serial steps run on member 0 between
  // barriers. An error in a serial step is seen by every member after the barrier, so the team
  // leaves the pass together.
  team.run([&](int me) {
    auto serial = [&](auto&& f) {
      if (me == 0 && !err) try {
          f();
        } catch (...) {
          err = std::current_exception();
        }
      team.barrier();
      return !err;
    };
    auto product = [&](const Linear& w, const float* in, float* out, bool acc, int64_t rows) {
      apply(w, in, rows, out, acc, me, nt);
    };
    // Row-wise steps split rows (element-wise ones elements) among the members.
    const auto [r0, r1] = ThreadTeam::split(n, me, nt);
    const auto [e0, e1] = ThreadTeam::split(n * c.ffn, me, nt);
    CausalCall::Workspace workspace;
    // What a layer's attention call sees pass through the caches before the next call on the same
    // sides: every layer's K/V and the weights (before this chunk's appends: close enough).
    const double kv_bytes = cache.bytes() + static_cast<double>(weight_bytes());
    for (int l = 0; l < c.layers; ++l) {
      const Block& b = blocks_[static_cast<size_t>(l)];
      auto& side = cache.layers()[static_cast<size_t>(l)];
      rms_norm_rows(x, b.attn_norm, c.rms_eps, xn, r0, r1);
      team.barrier();
      product(b.wq, xn.data(), q.data(), false, n);
      product(b.wk, xn.data(), k.data(), false, n);
      product(b.wv, xn.data(), v.data(), false, n);
      team.barrier();
      if (c.qkv_bias || c.qk_norm) {  // the table's optional pieces, each member its rows
        if (c.qkv_bias)
          for (Eigen::Index r = r0; r < r1; ++r) {
            q.row(r) += b.bq.transpose();
            k.row(r) += b.bk.transpose();
            v.row(r) += b.bv.transpose();
          }
        if (c.qk_norm) {  // RMSNorm over each head's head_dim channels, before RoPE
          rms_norm_heads(q, b.q_norm, c.rms_eps, r0, r1);
          rms_norm_heads(k, b.k_norm, c.rms_eps, r0, r1);
        }
        team.barrier();
      }
      const bool ok = serial([&] {
        rope(q.data(), n, c.heads, pos0);
        if (pre || observe) k_pre = k;
        rope(k.data(), n, H, pos0);
        if (observe) observe(l, pos0, n, k_pre.data(), k.data(), v.data());
        // Exact values the new positions may need: the cache's window before the append + the
        // chunk.
        // Backend cpu reads the tails as stored (rot= sides: rotated); pre-RoPE keys are read
        // back through a view in the model's own space.
        const TailSpace space = tail_space(backend_);
        kbeg = gather_exact_tail(*side.k, pre ? k_pre.data() : k.data(), n, ktail,
                                 pre ? TailSpace::kModel : space);
        vbeg = gather_exact_tail(*side.v, v.data(), n, vtail, space);
        // Pre-RoPE keys: the window and the chunk as stored (through a rot= side's rotation and
        // back), then rotated to their positions, so a token reads the same bits in any call.
        if (pre) rope(ktail.data(), pos0 + n - kbeg, H, kbeg);
        side.k->append(pre ? k_pre.data() : k.data(), n);
        side.v->append(v.data(), n);
        view.reset();
        if (pre) {
          // Pre-RoPE keys: read the stored (quantized) keys back, rotate them to their
          // positions, and attend over that; the exact tail was captured post-RoPE above.
          Tensor3 kr = side.k->dequantize();
          rope(kr.data.data(), kr.shape.tokens, H, 0);
          view = make_view(*side.k, std::move(kr));
        }
        const SideStore& keys = view ? *view : *side.k;
        const ExactTail ke{ktail.data(), kbeg}, ve{vtail.data(), vbeg};
        CausalArgs a{q.data(), n, c.heads, pos0, &keys, side.v.get(), ke, ve};
        a.window = c.window_of(l);
        call = std::make_unique<CausalCall>(backend_, a, nt, kv_bytes);
        next_item.store(0);
        next_merge.store(0);
      });
      if (!ok) break;
      for (int64_t it; (it = next_item.fetch_add(1)) < call->items();)
        call->run(it, attn.data(), workspace);
      if (call->merges() > 0) {
        team.barrier();
        for (int64_t it; (it = next_merge.fetch_add(1)) < call->merges();)
          call->merge(it, attn.data());
      }
      team.barrier();
      // back from a rot= value side's space, each member its rows
      if (call->rotates_output()) {
        call->finish(attn.data() + r0 * qd, (r1 - r0) * c.heads);
        team.barrier();
      }
      product(b.wo, attn.data(), x.data(), true, n);
      team.barrier();
      if (c.o_bias)
        for (Eigen::Index r = r0; r < r1; ++r) x.row(r) += b.bo.transpose();
      rms_norm_rows(x, b.ffn_norm, c.rms_eps, xn, r0, r1);
      team.barrier();
      product(b.w_gate, xn.data(), g.data(), false, n);
      product(b.w_up, xn.data(), u.data(), false, n);
      team.barrier();
      float* gp = g.data();
      const float* up = u.data();
      for (int64_t e = e0; e < e1; ++e)
        gp[e] = gp[e] / (1.0f + std::exp(-gp[e])) * up[e];  // SiLU(g) * u
      team.barrier();
      product(b.w_down, g.data(), x.data(), true, n);
      team.barrier();
    }
    if (!err) {
      if (me == 0) {
        const Mat last = all_logits ? Mat(x) : Mat(x.bottomRows(1));
        rms_norm_rows(last, out_norm_, c.rms_eps, y, 0, rows_out);
      }
      team.barrier();
      product(head_, y.data(), logits.data(), false, rows_out);
    }
  });
  if (err) std::rethrow_exception(err);
  if (threads <= 0)
    team_->chooser->record(
        nt, n, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
}

}  // namespace kvq
