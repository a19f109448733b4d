// The model's weights in device memory and its decode step's dense part (device_model.h): host
// code over the CUDA runtime and model_kernels.h's launchers.
#include "kernels/cuda/device_model.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
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
    if (ptr) {  // a scratch buffer grown: its contents are not kept (cudaFree waits for the device)
      KVQ_CUDA_CHECK(cudaFree(ptr));
      ptr = nullptr;
      bytes = 0;
    }
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
  // Activations, `cap` rows each: x, h [hidden], q|k|v, q alone [q_dim] (the decode launch's
  // contiguous q), o [q_dim], g|u [2 ffn], logits [vocab]; the step's upload: model::RopeAngles
  // [cap] then int32 token ids [cap].
  DeviceBuffer x, h, qkv, q, o, gu, logits, step;
  int64_t cap = 0;
  std::vector<char> step_host;
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
  const model::RopeAngles* step_angles() const {
    return static_cast<const model::RopeAngles*>(step.ptr);
  }
  const int32_t* step_ids() const {
    return reinterpret_cast<const int32_t*>(static_cast<const char*>(step.ptr) +
                                            cap * static_cast<int64_t>(sizeof(model::RopeAngles)));
  }
  void reserve(int64_t b);
  // A layer's halves and the logits (head) over the first n rows of the activations. Rows take the
  // angles `a` (n = 1) or rows_a[r] (device memory).
  void attention_in(int layer, int64_t n, const model::RopeAngles& a,
                    const model::RopeAngles* rows_a);
  void attention_out(int layer, int64_t n);
  // The logits of rows first .. first + n - 1 into out [n, vocab] (host).
  void head(int64_t n, float* out, int64_t first = 0);
  // A batched step's upload, embedding and layers over rows tokens[i] at positions[i] (checked,
  // then owner.missing()), `attend(layer, qkv, q, attn)` between each layer's halves; the head is
  // the caller's.
  void layers(const DeviceModel& owner, std::span<const int32_t> tokens,
              std::span<const int64_t> positions, std::span<const float> inv_freq,
              const std::function<void(int, const float*, const float*, float*)>& attend);
};

void DeviceModel::Impl::reserve(int64_t b) {
  KVQ_CHECK(b >= 1 && b <= 65535, "device model: batch {} outside [1, 65535]", b);
  if (b <= cap) return;
  const int64_t f = sizeof(float), qkv_rows = s.q_dim() + 2 * s.kv_dim();
  x.alloc(b * s.hidden * f);
  h.alloc(b * s.hidden * f);
  qkv.alloc(b * qkv_rows * f);
  q.alloc(b * s.q_dim() * f);
  o.alloc(b * s.q_dim() * f);
  gu.alloc(b * 2 * s.ffn * f);
  logits.alloc(b * s.vocab * f);
  step.alloc(b * static_cast<int64_t>(sizeof(model::RopeAngles) + sizeof(int32_t)));
  cap = b;
}

void DeviceModel::Impl::attention_in(int layer, int64_t n, const model::RopeAngles& a,
                                     const model::RopeAngles* rows_a) {
  check_layer(layer);
  const int64_t qd = s.q_dim(), kvd = s.kv_dim(), rows = qd + 2 * kvd;
  float* qp = qkv.f();
  float* kp = qp + qd;
  model::rms_norm(x.f(), layer_vec(layer, kAttnNormSlot), n, s.hidden, s.eps, h.f());
  model::gemv(layer_mat(layer, kQkv), bf16, rows, s.hidden, h.f(), qp, false, n);  // q|k|v
  if (s.qkv_bias) model::add(qp, layer_vec(layer, kQkvBias), rows, n);
  if (s.qk_norm) {  // each head's head_dim channels, before RoPE; a group a row
    model::rms_norm(qp, layer_vec(layer, kQNormSlot), s.heads, s.head_dim, s.eps, qp, n, rows);
    model::rms_norm(kp, layer_vec(layer, kKNormSlot), s.kv_heads, s.head_dim, s.eps, kp, n, rows);
  }
  model::rope(qp, s.heads, s.head_dim, s.rope_half, a, n, rows, rows_a);
  model::rope(kp, s.kv_heads, s.head_dim, s.rope_half, a, n, rows, rows_a);
}

void DeviceModel::Impl::attention_out(int layer, int64_t n) {
  check_layer(layer);
  model::gemv(layer_mat(layer, kOutProj), bf16, s.hidden, s.q_dim(), o.f(), x.f(), true, n);
  if (s.o_bias) model::add(x.f(), layer_vec(layer, kOBiasSlot), s.hidden, n);
  model::rms_norm(x.f(), layer_vec(layer, kFfnNormSlot), n, s.hidden, s.eps, h.f());
  float* g = gu.f();
  model::gemv(layer_mat(layer, kGateUp), bf16, 2 * s.ffn, s.hidden, h.f(), g, false, n);  // g|u
  model::silu_mul(g, g + s.ffn, s.ffn, n, 2 * s.ffn);
  model::gemv(layer_mat(layer, kDownProj), bf16, s.hidden, s.ffn, g, x.f(), true, n, 2 * s.ffn);
}

void DeviceModel::Impl::head(int64_t n, float* out, int64_t first) {
  model::rms_norm(x.f() + first * s.hidden,
                  vecs[static_cast<size_t>(s.layers * kLayerVecSlots)].f(), n, s.hidden, s.eps,
                  h.f());
  model::gemv(slot(s.layers * kLayerSlots), bf16, s.vocab, s.hidden, h.f(), logits.f(), false, n);
  KVQ_CUDA_CHECK(cudaMemcpy(out, logits.ptr, static_cast<size_t>(n * s.vocab) * sizeof(float),
                            cudaMemcpyDeviceToHost));
}

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
  p.reserve(1);
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
  p_->attention_in(layer, 1, a, nullptr);
}

void DeviceModel::attention_out(int layer) { p_->attention_out(layer, 1); }

void DeviceModel::logits(float* out) { p_->head(1, out); }

int64_t DeviceModel::activation_bytes(const DeviceModelShape& s, int64_t batch) {
  const int64_t per_row =
      2 * s.hidden + (s.q_dim() + 2 * s.kv_dim()) + 2 * s.q_dim() + 2 * s.ffn + s.vocab;
  return batch * (per_row * static_cast<int64_t>(sizeof(float)) +
                  static_cast<int64_t>(sizeof(model::RopeAngles) + sizeof(int32_t)));
}

void DeviceModel::reserve_batch(int64_t batch) { p_->reserve(batch); }
int64_t DeviceModel::batch_capacity() const { return p_->cap; }

void DeviceModel::decode_batch(std::span<const int32_t> tokens, std::span<const int64_t> positions,
                               std::span<const float> inv_freq, const AttendBatch& attend,
                               float* logits_out) {
  p_->layers(*this, tokens, positions, inv_freq, attend);
  p_->head(static_cast<int64_t>(tokens.size()), logits_out);
}

std::vector<std::pair<int64_t, int64_t>> DeviceModel::prefill_chunks(int64_t n, int64_t chunk) {
  KVQ_CHECK(chunk >= 1 && n >= 0, "device model: a prefill of {} tokens in chunks of {}", n, chunk);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t b = 0; b < n; b += chunk) out.emplace_back(b, std::min(chunk, n - b));
  return out;
}

void DeviceModel::prefill(std::span<const int32_t> tokens, int64_t pos0,
                          std::span<const float> inv_freq, int64_t chunk, const AttendChunk& attend,
                          float* logits_out, bool all_logits) {
  const int64_t n = static_cast<int64_t>(tokens.size()), vocab = p_->s.vocab;
  KVQ_CHECK(n >= 1 && pos0 >= 0, "device model: a prefill of {} tokens at position {}", n, pos0);
  std::vector<int64_t> positions;
  for (const auto& [b, m] : prefill_chunks(n, chunk)) {
    positions.resize(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) positions[static_cast<size_t>(i)] = pos0 + b + i;
    p_->layers(*this, tokens.subspan(static_cast<size_t>(b), static_cast<size_t>(m)), positions,
               inv_freq, [&](int l, const float* qkv, const float* q, float* attn) {
                 attend(l, pos0 + b, m, qkv, q, attn);
               });
    if (all_logits)
      p_->head(m, logits_out + b * vocab);
    else if (b + m == n)
      p_->head(1, logits_out, m - 1);
  }
}

void DeviceModel::Impl::layers(
    const DeviceModel& owner, std::span<const int32_t> tokens, std::span<const int64_t> positions,
    std::span<const float> inv_freq,
    const std::function<void(int, const float*, const float*, float*)>& attend) {
  Impl& p = *this;
  const DeviceModelShape& s = p.s;
  const int64_t n = static_cast<int64_t>(tokens.size());
  KVQ_CHECK(n >= 1 && positions.size() == tokens.size(),
            "device model: a batched step of {} tokens at {} positions", tokens.size(),
            positions.size());
  KVQ_CHECK(static_cast<int64_t>(inv_freq.size()) == s.head_dim / 2,
            "device model: {} RoPE frequencies for head_dim {}", inv_freq.size(), s.head_dim);
  for (int64_t b = 0; b < n; ++b) {
    const int32_t id = tokens[static_cast<size_t>(b)];
    KVQ_CHECK(id >= 0 && id < s.vocab,
              "device model: sequence {}'s token id {} outside the vocabulary [0, {})", b, id,
              s.vocab);
    KVQ_CHECK(positions[static_cast<size_t>(b)] >= 0, "device model: sequence {}'s position {}", b,
              positions[static_cast<size_t>(b)]);
  }
  const std::string gap = owner.missing();
  KVQ_CHECK(gap.empty(), "device model: {} was never uploaded", gap);
  p.reserve(n);
  // the step's one upload: the rows' angles, then their token ids (the ids after all cap angles)
  const size_t angles_bytes = static_cast<size_t>(p.cap) * sizeof(model::RopeAngles);
  p.step_host.resize(angles_bytes + static_cast<size_t>(n) * sizeof(int32_t));
  for (int64_t b = 0; b < n; ++b) {
    const model::RopeAngles a = model::rope_angles(inv_freq, positions[static_cast<size_t>(b)]);
    std::memcpy(p.step_host.data() + static_cast<size_t>(b) * sizeof(a), &a, sizeof(a));
  }
  std::memcpy(p.step_host.data() + angles_bytes, tokens.data(),
              static_cast<size_t>(n) * sizeof(int32_t));
  // (rows n .. cap of the angles are not read: sent as they lie, one copy instead of two)
  KVQ_CUDA_CHECK(
      cudaMemcpy(p.step.ptr, p.step_host.data(), p.step_host.size(), cudaMemcpyHostToDevice));
  model::embed_rows(p.slot(s.layers * kLayerSlots + (s.tied ? 0 : 1)), p.bf16, s.hidden,
                    p.step_ids(), n, p.x.f());
  const int64_t qd = s.q_dim(), qkv_rows = qd + 2 * s.kv_dim();
  const model::RopeAngles unused{};
  for (int l = 0; l < s.layers; ++l) {
    p.attention_in(l, n, unused, p.step_angles());
    // q of every row side by side for the decode launch (one strided device copy)
    KVQ_CUDA_CHECK(cudaMemcpy2D(p.q.ptr, static_cast<size_t>(qd) * sizeof(float), p.qkv.ptr,
                                static_cast<size_t>(qkv_rows) * sizeof(float),
                                static_cast<size_t>(qd) * sizeof(float), static_cast<size_t>(n),
                                cudaMemcpyDeviceToDevice));
    attend(l, p.qkv.f(), p.q.f(), p.o.f());
    p.attention_out(l, n);
  }
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
