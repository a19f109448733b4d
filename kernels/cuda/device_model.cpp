// The model's weights in device memory and its decode step's dense part (device_model.h): host
// code over the CUDA runtime and model_kernels.h's launchers.
#include "kernels/cuda/device_model.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cuda/cuda_check.h"

namespace kvq::cuda {
namespace {

// One device allocation (cudaMalloc: 256-byte aligned, so the gemv's 16-byte loads hold).
struct DeviceBuffer {
  void* ptr = nullptr;
  int64_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr(std::exchange(o.ptr, nullptr)), bytes(std::exchange(o.bytes, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr, o.ptr);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);  // no throw from a destructor; a failed free leaks nothing we track
  }
  void alloc(int64_t n) {
    KVQ_CHECK(n > 0, "device model: allocation of {} bytes", n);
    KVQ_CUDA_CHECK(cudaMalloc(&ptr, static_cast<size_t>(n)));
    bytes = n;
  }
  float* f() const { return static_cast<float*>(ptr); }
};

constexpr const char* kMatrixNames[] = {"q_proj",    "k_proj",    "v_proj",
                                        "o_proj",    "gate_proj", "up_proj",
                                        "down_proj", "lm_head",   "embed_tokens"};
constexpr const char* kVectorNames[] = {"input_layernorm",
                                        "post_attention_layernorm",
                                        "q_proj.bias",
                                        "k_proj.bias",
                                        "v_proj.bias",
                                        "o_proj.bias",
                                        "q_norm",
                                        "k_norm",
                                        "norm"};
constexpr int kMatrices = 9, kVectors = 9;

// Where a layer's matrices live: q, k and v stacked in one [q_dim + 2 kv_dim][hidden] matrix (one
// gemv writes q|k|v), gate and up in one [2 ffn][hidden] (one gemv writes g|u); o and down alone.
enum Slot { kQkv, kOutProj, kGateUp, kDownProj, kHeadSlot, kEmbedSlot };
constexpr int kLayerSlots = 4;
// Vectors likewise: the three biases stacked as one [q_dim + 2 kv_dim].
enum VecSlot {
  kAttnNormSlot,
  kFfnNormSlot,
  kQkvBias,
  kOBiasSlot,
  kQNormSlot,
  kKNormSlot,
  kOutNormSlot
};
constexpr int kLayerVecSlots = 6;

// Rows converted and uploaded at once: bounds the host buffer to ~16 MB of floats.
int64_t chunk_rows(int64_t cols) { return std::max<int64_t>(1, (int64_t{4} << 20) / cols); }

}  // namespace

struct DeviceModel::Impl {
  DeviceModelShape s;
  bool bf16 = true;
  std::vector<DeviceBuffer> mats, vecs;  // by slot: layer * per-layer slots + slot, then globals
  std::vector<char> mat_set, vec_set;    // by (layer, Matrix / Vector)
  DeviceBuffer x, h, qkv, o, gu, logits;
  std::vector<float> staging;
  std::vector<uint16_t> staging16;

  int64_t qd() const { return s.q_dim(); }
  int64_t kvd() const { return s.kv_dim(); }
  void check_layer(int layer) const {
    KVQ_CHECK(layer >= 0 && layer < s.layers, "device model: layer {} outside [0, {})", layer,
              s.layers);
  }
  // The buffer index, its [rows, cols], and the first row matrix m takes in it.
  struct Place {
    size_t index;
    int64_t rows, cols, row0;
  };
  Place place(Matrix m, int layer) const {
    const int64_t L = s.layers, qkv_rows = qd() + 2 * kvd();
    auto at = [&](int slot, int64_t rows, int64_t cols, int64_t row0) {
      check_layer(layer);
      return Place{static_cast<size_t>(layer * kLayerSlots + slot), rows, cols, row0};
    };
    switch (m) {
      case Matrix::kQ:
        return at(kQkv, qkv_rows, s.hidden, 0);
      case Matrix::kK:
        return at(kQkv, qkv_rows, s.hidden, qd());
      case Matrix::kV:
        return at(kQkv, qkv_rows, s.hidden, qd() + kvd());
      case Matrix::kO:
        return at(kOutProj, s.hidden, qd(), 0);
      case Matrix::kGate:
        return at(kGateUp, 2 * s.ffn, s.hidden, 0);
      case Matrix::kUp:
        return at(kGateUp, 2 * s.ffn, s.hidden, s.ffn);
      case Matrix::kDown:
        return at(kDownProj, s.hidden, s.ffn, 0);
      case Matrix::kHead:
        return Place{static_cast<size_t>(L * kLayerSlots), s.vocab, s.hidden, 0};
      case Matrix::kEmbed:
        return Place{static_cast<size_t>(L * kLayerSlots + 1), s.vocab, s.hidden, 0};
    }
    fail("device model: unknown matrix {}", static_cast<int>(m));
  }
  struct VecPlace {
    size_t index;
    int64_t size, offset;
  };
  VecPlace vplace(Vector v, int layer) const {
    const int64_t qkv_rows = qd() + 2 * kvd();
    auto at = [&](int slot, int64_t size, int64_t offset) {
      check_layer(layer);
      return VecPlace{static_cast<size_t>(layer * kLayerVecSlots + slot), size, offset};
    };
    switch (v) {
      case Vector::kAttnNorm:
        return at(kAttnNormSlot, s.hidden, 0);
      case Vector::kFfnNorm:
        return at(kFfnNormSlot, s.hidden, 0);
      case Vector::kQBias:
        return at(kQkvBias, qkv_rows, 0);
      case Vector::kKBias:
        return at(kQkvBias, qkv_rows, qd());
      case Vector::kVBias:
        return at(kQkvBias, qkv_rows, qd() + kvd());
      case Vector::kOBias:
        return at(kOBiasSlot, s.hidden, 0);
      case Vector::kQNorm:
        return at(kQNormSlot, s.head_dim, 0);
      case Vector::kKNorm:
        return at(kKNormSlot, s.head_dim, 0);
      case Vector::kOutNorm:
        return VecPlace{static_cast<size_t>(s.layers * kLayerVecSlots), s.hidden, 0};
    }
    fail("device model: unknown vector {}", static_cast<int>(v));
  }
  size_t set_index(int what, int layer, int per_layer, bool global) const {
    return global ? static_cast<size_t>(s.layers * per_layer + what)
                  : static_cast<size_t>(layer * per_layer + what);
  }
  const void* slot(int index) const { return mats[static_cast<size_t>(index)].ptr; }
  const void* layer_mat(int layer, Slot sl) const { return slot(layer * kLayerSlots + sl); }
  const float* layer_vec(int layer, VecSlot sl) const {
    return vecs[static_cast<size_t>(layer * kLayerVecSlots + sl)].f();
  }
};

DeviceModel::DeviceModel(const DeviceModelShape& s, bool bf16) : p_(std::make_unique<Impl>()) {
  KVQ_CHECK(s.layers > 0 && s.hidden > 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0 &&
                s.ffn > 0 && s.vocab > 0 && s.heads % s.kv_heads == 0 && s.head_dim % 2 == 0,
            "device model: bad shape ({} layers, hidden {}, {} heads, {} kv heads, head_dim {}, "
            "ffn {}, vocab {})",
            s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.ffn, s.vocab);
  KVQ_CHECK(s.head_dim / 2 <= model::kMaxRopePairs,
            "device model: head_dim {} is over the {} the CUDA RoPE takes", s.head_dim,
            2 * model::kMaxRopePairs);
  Impl& p = *p_;
  p.s = s;
  p.bf16 = bf16;
  p.mats.resize(static_cast<size_t>(s.layers * kLayerSlots + 2));
  p.vecs.resize(static_cast<size_t>(s.layers * kLayerVecSlots + 1));
  p.mat_set.assign(static_cast<size_t>(s.layers * kMatrices + kMatrices), 0);
  p.vec_set.assign(static_cast<size_t>(s.layers * kVectors + kVectors), 0);
  const int64_t f = sizeof(float), qkv = s.q_dim() + 2 * s.kv_dim();
  p.x.alloc(s.hidden * f);
  p.h.alloc(s.hidden * f);
  p.qkv.alloc(qkv * f);
  p.o.alloc(s.q_dim() * f);
  p.gu.alloc(2 * s.ffn * f);
  p.logits.alloc(s.vocab * f);
}

DeviceModel::~DeviceModel() = default;

std::pair<int64_t, int64_t> DeviceModel::matrix_shape(Matrix m) const {
  const DeviceModelShape& s = p_->s;
  switch (m) {
    case Matrix::kQ:
      return {s.q_dim(), s.hidden};
    case Matrix::kK:
    case Matrix::kV:
      return {s.kv_dim(), s.hidden};
    case Matrix::kO:
      return {s.hidden, s.q_dim()};
    case Matrix::kGate:
    case Matrix::kUp:
      return {s.ffn, s.hidden};
    case Matrix::kDown:
      return {s.hidden, s.ffn};
    case Matrix::kHead:
    case Matrix::kEmbed:
      return {s.vocab, s.hidden};
  }
  return {0, 0};
}

int64_t DeviceModel::vector_size(Vector v) const {
  const DeviceModelShape& s = p_->s;
  switch (v) {
    case Vector::kAttnNorm:
    case Vector::kFfnNorm:
    case Vector::kOutNorm:
      return s.hidden;
    case Vector::kQBias:
      return s.qkv_bias ? s.q_dim() : 0;
    case Vector::kKBias:
    case Vector::kVBias:
      return s.qkv_bias ? s.kv_dim() : 0;
    case Vector::kOBias:
      return s.o_bias ? s.hidden : 0;
    case Vector::kQNorm:
    case Vector::kKNorm:
      return s.qk_norm ? s.head_dim : 0;
  }
  return 0;
}

void DeviceModel::set_matrix(Matrix m, int layer, const std::function<void(int64_t, float*)>& row) {
  Impl& p = *p_;
  KVQ_CHECK(m != Matrix::kEmbed || !p.s.tied,
            "device model: a tied model has no separate embed_tokens (the head is the embedding)");
  const auto [rows, cols] = matrix_shape(m);
  const Impl::Place at = p.place(m, layer);
  DeviceBuffer& d = p.mats[at.index];
  const int64_t esize = p.bf16 ? 2 : 4;
  if (!d.ptr) d.alloc(at.rows * at.cols * esize);
  const int64_t step = chunk_rows(cols);
  p.staging.resize(static_cast<size_t>(std::min(step, rows) * cols));
  if (p.bf16) p.staging16.resize(p.staging.size());
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    const int64_t n = std::min(step, rows - r0);
    for (int64_t r = 0; r < n; ++r) row(r0 + r, p.staging.data() + r * cols);
    const void* src = p.staging.data();
    if (p.bf16) {
      for (int64_t i = 0; i < n * cols; ++i)
        p.staging16[static_cast<size_t>(i)] = float_to_bf16_bits(p.staging[static_cast<size_t>(i)]);
      src = p.staging16.data();
    }
    // synchronous: the staging buffer is reused by the next chunk
    KVQ_CUDA_CHECK(cudaMemcpy(static_cast<char*>(d.ptr) + (at.row0 + r0) * cols * esize, src,
                              static_cast<size_t>(n * cols * esize), cudaMemcpyHostToDevice));
  }
  const bool global = m == Matrix::kHead || m == Matrix::kEmbed;
  p.mat_set[p.set_index(static_cast<int>(m), layer, kMatrices, global)] = 1;
}

void DeviceModel::set_vector(Vector v, int layer, const float* x) {
  Impl& p = *p_;
  const int64_t n = vector_size(v);
  KVQ_CHECK(n > 0, "device model: this shape has no {}", kVectorNames[static_cast<int>(v)]);
  const Impl::VecPlace at = p.vplace(v, layer);
  DeviceBuffer& d = p.vecs[at.index];
  if (!d.ptr) d.alloc(at.size * static_cast<int64_t>(sizeof(float)));
  KVQ_CUDA_CHECK(cudaMemcpy(d.f() + at.offset, x, static_cast<size_t>(n) * sizeof(float),
                            cudaMemcpyHostToDevice));
  p.vec_set[p.set_index(static_cast<int>(v), layer, kVectors, v == Vector::kOutNorm)] = 1;
}

std::string DeviceModel::missing() const {
  const Impl& p = *p_;
  const DeviceModelShape& s = p.s;
  for (int l = 0; l < s.layers; ++l) {
    for (int m = 0; m < static_cast<int>(Matrix::kHead); ++m)
      if (!p.mat_set[p.set_index(m, l, kMatrices, false)])
        return fmt::format("layer {} {}", l, kMatrixNames[m]);
    for (int v = 0; v < static_cast<int>(Vector::kOutNorm); ++v)
      if (vector_size(static_cast<Vector>(v)) > 0 && !p.vec_set[p.set_index(v, l, kVectors, false)])
        return fmt::format("layer {} {}", l, kVectorNames[v]);
  }
  if (!p.mat_set[p.set_index(static_cast<int>(Matrix::kHead), 0, kMatrices, true)])
    return "lm_head";
  if (!s.tied && !p.mat_set[p.set_index(static_cast<int>(Matrix::kEmbed), 0, kMatrices, true)])
    return "embed_tokens";
  if (!p.vec_set[p.set_index(static_cast<int>(Vector::kOutNorm), 0, kVectors, true)]) return "norm";
  return {};
}

int64_t DeviceModel::weight_bytes() const {
  int64_t b = 0;
  for (const DeviceBuffer& d : p_->mats) b += d.bytes;
  return b;
}

bool DeviceModel::bf16() const { return p_->bf16; }
const DeviceModelShape& DeviceModel::shape() const { return p_->s; }
const float* DeviceModel::device_qkv() const { return p_->qkv.f(); }
float* DeviceModel::device_attn() { return p_->o.f(); }

void DeviceModel::embed(int32_t id) {
  const Impl& p = *p_;
  const DeviceModelShape& s = p.s;
  KVQ_CHECK(id >= 0 && id < s.vocab, "device model: token id {} outside the vocabulary [0, {})", id,
            s.vocab);
  const std::string gap = missing();
  KVQ_CHECK(gap.empty(), "device model: {} was never uploaded", gap);
  model::embed_row(p.slot(s.layers * kLayerSlots + (s.tied ? 0 : 1)), p.bf16, s.hidden, id,
                   p.x.f());
}

void DeviceModel::attention_in(int layer, const model::RopeAngles& a) {
  Impl& p = *p_;
  const DeviceModelShape& s = p.s;
  p.check_layer(layer);
  const int64_t qd = p.qd(), kvd = p.kvd(), rows = qd + 2 * kvd;
  float* q = p.qkv.f();
  float* k = q + qd;
  model::rms_norm(p.x.f(), p.layer_vec(layer, kAttnNormSlot), 1, s.hidden, s.eps, p.h.f());
  model::gemv(p.layer_mat(layer, kQkv), p.bf16, rows, s.hidden, p.h.f(), q, false);  // q|k|v
  if (s.qkv_bias) model::add(q, p.layer_vec(layer, kQkvBias), rows);
  if (s.qk_norm) {  // each head's head_dim channels, before RoPE
    model::rms_norm(q, p.layer_vec(layer, kQNormSlot), s.heads, s.head_dim, s.eps, q);
    model::rms_norm(k, p.layer_vec(layer, kKNormSlot), s.kv_heads, s.head_dim, s.eps, k);
  }
  model::rope(q, s.heads, s.head_dim, s.rope_half, a);
  model::rope(k, s.kv_heads, s.head_dim, s.rope_half, a);
}

void DeviceModel::attention_out(int layer) {
  Impl& p = *p_;
  const DeviceModelShape& s = p.s;
  p.check_layer(layer);
  model::gemv(p.layer_mat(layer, kOutProj), p.bf16, s.hidden, s.q_dim(), p.o.f(), p.x.f(), true);
  if (s.o_bias) model::add(p.x.f(), p.layer_vec(layer, kOBiasSlot), s.hidden);
  model::rms_norm(p.x.f(), p.layer_vec(layer, kFfnNormSlot), 1, s.hidden, s.eps, p.h.f());
  float* g = p.gu.f();
  model::gemv(p.layer_mat(layer, kGateUp), p.bf16, 2 * s.ffn, s.hidden, p.h.f(), g, false);  // g|u
  model::silu_mul(g, g + s.ffn, s.ffn);
  model::gemv(p.layer_mat(layer, kDownProj), p.bf16, s.hidden, s.ffn, g, p.x.f(), true);
}

void DeviceModel::logits(float* out) {
  Impl& p = *p_;
  const DeviceModelShape& s = p.s;
  model::rms_norm(p.x.f(), p.vecs[static_cast<size_t>(s.layers * kLayerVecSlots)].f(), 1, s.hidden,
                  s.eps, p.h.f());
  model::gemv(p.slot(s.layers * kLayerSlots), p.bf16, s.vocab, s.hidden, p.h.f(), p.logits.f(),
              false);
  KVQ_CUDA_CHECK(cudaMemcpy(out, p.logits.ptr, static_cast<size_t>(s.vocab) * sizeof(float),
                            cudaMemcpyDeviceToHost));
}

void DeviceModel::decode(std::span<const int32_t> tokens, int64_t pos0,
                         std::span<const float> inv_freq, const Attend& attend, float* logits_out,
                         bool all_logits) {
  const DeviceModelShape& s = p_->s;
  const int64_t n = static_cast<int64_t>(tokens.size());
  KVQ_CHECK(static_cast<int64_t>(inv_freq.size()) == s.head_dim / 2,
            "device model: {} RoPE frequencies for head_dim {}", inv_freq.size(), s.head_dim);
  for (int64_t t = 0; t < n; ++t) {
    embed(tokens[static_cast<size_t>(t)]);
    const model::RopeAngles angles = model::rope_angles(inv_freq, pos0 + t);
    for (int l = 0; l < s.layers; ++l) {
      attention_in(l, angles);
      attend(l, pos0 + t, device_qkv(), device_attn());
      attention_out(l);
    }
    if (all_logits || t == n - 1) logits(logits_out + (all_logits ? t : 0) * s.vocab);
  }
}

}  // namespace kvq::cuda
