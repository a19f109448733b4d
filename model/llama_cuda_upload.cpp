// The model's weights as backend cuda's device model takes them (LlamaModel::upload_device_weights:
// every matrix row by row through weight_row, the norms and biases as vectors). Its own object file
// in kvq_model, apart from llama_cuda.cpp: it calls kernels/cuda/device_model.cpp, which exists
// only where CUDA is built (or where a test compiles it against the host runtime stand-in), and a
// static link pulls this object only into a program that calls it; so a build without CUDA links
// (the Python module, a machine without nvcc) and the host test of the device model still runs it.
#include <array>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/device_model.h"
#include "model/arch.h"
#include "model/llama.h"

namespace kvq {

namespace {

using M = cuda::DeviceModel::Matrix;
using V = cuda::DeviceModel::Vector;

// The device model's weights are model/arch.h's tensor roles split into matrices and vectors
// (kernels/cuda/ cannot include model/: the layers, scripts/check-layers.py). The one translation,
// checked below at compile time: every role is exactly one Matrix or Vector and back.
constexpr std::array<std::pair<M, TensorRole>, 9> kMatrixRoles{{{M::kQ, TensorRole::kQ},
                                                                {M::kK, TensorRole::kK},
                                                                {M::kV, TensorRole::kV},
                                                                {M::kO, TensorRole::kO},
                                                                {M::kGate, TensorRole::kGate},
                                                                {M::kUp, TensorRole::kUp},
                                                                {M::kDown, TensorRole::kDown},
                                                                {M::kHead, TensorRole::kOutput},
                                                                {M::kEmbed, TensorRole::kEmbed}}};
constexpr std::array<std::pair<V, TensorRole>, 9> kVectorRoles{
    {{V::kAttnNorm, TensorRole::kAttnNorm},
     {V::kFfnNorm, TensorRole::kFfnNorm},
     {V::kQBias, TensorRole::kQBias},
     {V::kKBias, TensorRole::kKBias},
     {V::kVBias, TensorRole::kVBias},
     {V::kOBias, TensorRole::kOBias},
     {V::kQNorm, TensorRole::kQNorm},
     {V::kKNorm, TensorRole::kKNorm},
     {V::kOutNorm, TensorRole::kOutNorm}}};

// Each table lists its enum in declaration order (so a value added at the end is missed here), and
// the roles they name are every TensorRole once.
constexpr bool roles_agree() {
  for (size_t i = 0; i < kMatrixRoles.size(); ++i)
    if (static_cast<size_t>(kMatrixRoles[i].first) != i) return false;
  for (size_t i = 0; i < kVectorRoles.size(); ++i)
    if (static_cast<size_t>(kVectorRoles[i].first) != i) return false;
  constexpr size_t n = static_cast<size_t>(TensorRole::kCount);
  if (kMatrixRoles.size() + kVectorRoles.size() != n) return false;
  std::array<int, n> seen{};
  for (const auto& [m, r] : kMatrixRoles) ++seen[static_cast<size_t>(r)];
  for (const auto& [v, r] : kVectorRoles) ++seen[static_cast<size_t>(r)];
  for (int c : seen)
    if (c != 1) return false;
  return true;
}
static_assert(roles_agree(),
              "cuda::DeviceModel's Matrix / Vector and model/arch.h's TensorRole disagree: update "
              "kMatrixRoles / kVectorRoles (and the device model) together");
static_assert(static_cast<size_t>(M::kEmbed) + 1 == kMatrixRoles.size() &&
                  static_cast<size_t>(V::kOutNorm) + 1 == kVectorRoles.size(),
              "a Matrix or Vector value past the tables' last");

}  // namespace

void LlamaModel::weight_row(const Linear& l, int64_t r, float* out) const {
  if (store_ != WeightStore::kFp32) {
    l.packed.weight_row(r, out);
  } else {  // wt is W transposed, [in][out]
    for (int64_t k = 0; k < l.in; ++k) out[k] = l.wt[static_cast<size_t>(k * l.out + r)];
  }
}

void LlamaModel::upload_device_weights(cuda::DeviceModel& dev) const {
  const LlamaConfig& c = cfg_;
  auto put = [&](M m, int l, const Linear& w) {
    const auto [rows, cols] = dev.matrix_shape(m);
    KVQ_CHECK(w.out == rows && w.in == cols, "backend cuda: weight [{}, {}], expected [{}, {}]",
              w.out, w.in, rows, cols);
    dev.set_matrix(m, l, [&](int64_t r, float* out) { weight_row(w, r, out); });
  };
  for (int l = 0; l < c.layers; ++l) {
    const Block& b = blocks_[static_cast<size_t>(l)];
    put(M::kQ, l, b.wq);
    put(M::kK, l, b.wk);
    put(M::kV, l, b.wv);
    put(M::kO, l, b.wo);
    put(M::kGate, l, b.w_gate);
    put(M::kUp, l, b.w_up);
    put(M::kDown, l, b.w_down);
    dev.set_vector(V::kAttnNorm, l, b.attn_norm.data());
    dev.set_vector(V::kFfnNorm, l, b.ffn_norm.data());
    if (c.qkv_bias) {
      dev.set_vector(V::kQBias, l, b.bq.data());
      dev.set_vector(V::kKBias, l, b.bk.data());
      dev.set_vector(V::kVBias, l, b.bv.data());
    }
    if (c.o_bias) dev.set_vector(V::kOBias, l, b.bo.data());
    if (c.qk_norm) {
      dev.set_vector(V::kQNorm, l, b.q_norm.data());
      dev.set_vector(V::kKNorm, l, b.k_norm.data());
    }
  }
  put(M::kHead, 0, head_);
  if (!c.tied) put(M::kEmbed, 0, embed_);
  dev.set_vector(V::kOutNorm, 0, out_norm_.data());
}

}  // namespace kvq
