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
#include "kernels/cuda/device_side.h"

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
constexpr int kLayerMatrices = 7;  // kQ .. kDown
constexpr int kLayerVectors = 8;   // kAttnNorm .. kKNorm

// Rows converted and uploaded at once: bounds the host buffer to ~16 MB of floats.
int64_t chunk_rows(int64_t cols) { return std::max<int64_t>(1, (int64_t{4} << 20) / cols); }

}  // namespace

struct DeviceModel::Impl {
  DeviceModelShape s;
  bool bf16 = true;
  // matrices: layer * kLayerMatrices + m for the layers' own, then head and embed
  std::vector<DeviceBuffer> mats, vecs;
  DeviceBuffer x, h, qkv, o, g, u;
  std::vector<float> staging;
  std::vector<uint16_t> staging16;

  int64_t mat_index(Matrix m, int layer) const {
    const int mi = static_cast<int>(m);
    if (mi >= kLayerMatrices) return s.layers * kLayerMatrices + (mi - kLayerMatrices);
    KVQ_CHECK(layer >= 0 && layer < s.layers, "device model: layer {} outside [0, {})", layer,
              s.layers);
    return static_cast<int64_t>(layer) * kLayerMatrices + mi;
  }
  int64_t vec_index(Vector v, int layer) const {
    const int vi = static_cast<int>(v);
    if (vi >= kLayerVectors) return s.layers * kLayerVectors;
    KVQ_CHECK(layer >= 0 && layer < s.layers, "device model: layer {} outside [0, {})", layer,
              s.layers);
    return static_cast<int64_t>(layer) * kLayerVectors + vi;
  }
  const void* mat(Matrix m, int layer) const {
    return mats[static_cast<size_t>(mat_index(m, layer))].ptr;
  }
  const float* vec(Vector v, int layer) const {
    return vecs[static_cast<size_t>(vec_index(v, layer))].f();
  }
  void product(Matrix m, int layer, const float* in, float* out, bool acc, int64_t rows,
               int64_t cols) const {
    model::gemv(mat(m, layer), bf16, rows, cols, in, out, acc);
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
  require_device();
  p_->s = s;
  p_->bf16 = bf16;
  p_->mats.resize(static_cast<size_t>(s.layers * kLayerMatrices + 2));
  p_->vecs.resize(static_cast<size_t>(s.layers * kLayerVectors + 1));
  const int64_t f = sizeof(float);
  p_->x.alloc(s.hidden * f);
  p_->h.alloc(std::max(s.hidden, s.q_dim()) * f);
  p_->qkv.alloc((s.q_dim() + 2 * s.kv_dim()) * f);
  p_->o.alloc(std::max(s.q_dim(), s.vocab) * f);  // the attention output, then the logits
  p_->g.alloc(s.ffn * f);
  p_->u.alloc(s.ffn * f);
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
  KVQ_CHECK(m != Matrix::kEmbed || !p_->s.tied,
            "device model: a tied model has no separate embed_tokens (the head is the embedding)");
  const auto [rows, cols] = matrix_shape(m);
  DeviceBuffer& d = p_->mats[static_cast<size_t>(p_->mat_index(m, layer))];
  const int64_t esize = p_->bf16 ? 2 : 4;
  if (!d.ptr) d.alloc(rows * cols * esize);
  const int64_t step = chunk_rows(cols);
  p_->staging.resize(static_cast<size_t>(std::min(step, rows) * cols));
  if (p_->bf16) p_->staging16.resize(p_->staging.size());
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    const int64_t n = std::min(step, rows - r0);
    for (int64_t r = 0; r < n; ++r) row(r0 + r, p_->staging.data() + r * cols);
    const void* src = p_->staging.data();
    if (p_->bf16) {
      for (int64_t i = 0; i < n * cols; ++i)
        p_->staging16[static_cast<size_t>(i)] =
            float_to_bf16_bits(p_->staging[static_cast<size_t>(i)]);
      src = p_->staging16.data();
    }
    // synchronous: the staging buffer is reused by the next chunk
    KVQ_CUDA_CHECK(cudaMemcpy(static_cast<char*>(d.ptr) + r0 * cols * esize, src,
                              static_cast<size_t>(n * cols * esize), cudaMemcpyHostToDevice));
  }
}

void DeviceModel::set_vector(Vector v, int layer, const float* x) {
  const int64_t n = vector_size(v);
  KVQ_CHECK(n > 0, "device model: this shape has no {}", kVectorNames[static_cast<int>(v)]);
  DeviceBuffer& d = p_->vecs[static_cast<size_t>(p_->vec_index(v, layer))];
  if (!d.ptr) d.alloc(n * static_cast<int64_t>(sizeof(float)));
  KVQ_CUDA_CHECK(
      cudaMemcpy(d.ptr, x, static_cast<size_t>(n) * sizeof(float), cudaMemcpyHostToDevice));
}

std::string DeviceModel::missing() const {
  const DeviceModelShape& s = p_->s;
  for (int l = 0; l < s.layers; ++l) {
    for (int m = 0; m < kLayerMatrices; ++m)
      if (!p_->mat(static_cast<Matrix>(m), l))
        return fmt::format("layer {} {}", l, kMatrixNames[m]);
    for (int v = 0; v < kLayerVectors; ++v)
      if (vector_size(static_cast<Vector>(v)) > 0 && !p_->vec(static_cast<Vector>(v), l))
        return fmt::format("layer {} {}", l, kVectorNames[v]);
  }
  if (!p_->mat(Matrix::kHead, 0)) return "lm_head";
  if (!s.tied && !p_->mat(Matrix::kEmbed, 0)) return "embed_tokens";
  if (!p_->vec(Vector::kOutNorm, 0)) return "norm";
  return {};
}

int64_t DeviceModel::weight_bytes() const {
  int64_t b = 0;
  for (const DeviceBuffer& d : p_->mats) b += d.bytes;
  return b;
}

bool DeviceModel::bf16() const { return p_->bf16; }
const DeviceModelShape& DeviceModel::shape() const { return p_->s; }

void DeviceModel::embed(int32_t id) {
  const DeviceModelShape& s = p_->s;
  KVQ_CHECK(id >= 0 && id < s.vocab, "device model: token id {} outside the vocabulary [0, {})", id,
            s.vocab);
  const std::string gap = missing();
  KVQ_CHECK(gap.empty(), "device model: {} was never uploaded", gap);
  model::embed_row(p_->mat(s.tied ? Matrix::kHead : Matrix::kEmbed, 0), p_->bf16, s.hidden, id,
                   p_->x.f());
}

void DeviceModel::attention_in(int layer, const model::RopeAngles& a, float* qkv) {
  Impl& p = *p_;
  const DeviceModelShape& s = p.s;
  const int64_t qd = s.q_dim(), kvd = s.kv_dim();
  float* q = p.qkv.f();
  float* k = q + qd;
  float* v = k + kvd;
  model::rms_norm(p.x.f(), p.vec(Vector::kAttnNorm, layer), 1, s.hidden, s.eps, p.h.f());
  p.product(Matrix::kQ, layer, p.h.f(), q, false, qd, s.hidden);
  p.product(Matrix::kK, layer, p.h.f(), k, false, kvd, s.hidden);
  p.product(Matrix::kV, layer, p.h.f(), v, false, kvd, s.hidden);
  if (s.qkv_bias) {
    model::add(q, p.vec(Vector::kQBias, layer), qd);
    model::add(k, p.vec(Vector::kKBias, layer), kvd);
    model::add(v, p.vec(Vector::kVBias, layer), kvd);
  }
  if (s.qk_norm) {  // each head's head_dim channels, before RoPE
    model::rms_norm(q, p.vec(Vector::kQNorm, layer), s.heads, s.head_dim, s.eps, q);
    model::rms_norm(k, p.vec(Vector::kKNorm, layer), s.kv_heads, s.head_dim, s.eps, k);
  }
  model::rope(q, s.heads, s.head_dim, s.rope_half, a);
  model::rope(k, s.kv_heads, s.head_dim, s.rope_half, a);
  KVQ_CUDA_CHECK(cudaMemcpy(qkv, q, static_cast<size_t>(qd + 2 * kvd) * sizeof(float),
                            cudaMemcpyDeviceToHost));
}

void DeviceModel::attention_out(int layer, const float* o) {
  Impl& p = *p_;
  const DeviceModelShape& s = p.s;
  KVQ_CUDA_CHECK(cudaMemcpy(p.o.ptr, o, static_cast<size_t>(s.q_dim()) * sizeof(float),
                            cudaMemcpyHostToDevice));
  p.product(Matrix::kO, layer, p.o.f(), p.x.f(), true, s.hidden, s.q_dim());
  if (s.o_bias) model::add(p.x.f(), p.vec(Vector::kOBias, layer), s.hidden);
  model::rms_norm(p.x.f(), p.vec(Vector::kFfnNorm, layer), 1, s.hidden, s.eps, p.h.f());
  p.product(Matrix::kGate, layer, p.h.f(), p.g.f(), false, s.ffn, s.hidden);
  p.product(Matrix::kUp, layer, p.h.f(), p.u.f(), false, s.ffn, s.hidden);
  model::silu_mul(p.g.f(), p.u.f(), s.ffn);
  p.product(Matrix::kDown, layer, p.g.f(), p.x.f(), true, s.hidden, s.ffn);
}

void DeviceModel::logits(float* out) {
  Impl& p = *p_;
  const DeviceModelShape& s = p.s;
  model::rms_norm(p.x.f(), p.vec(Vector::kOutNorm, 0), 1, s.hidden, s.eps, p.h.f());
  p.product(Matrix::kHead, 0, p.h.f(), p.o.f(), false, s.vocab, s.hidden);
  KVQ_CUDA_CHECK(cudaMemcpy(out, p.o.ptr, static_cast<size_t>(s.vocab) * sizeof(float),
                            cudaMemcpyDeviceToHost));
}

}  // namespace kvq::cuda
