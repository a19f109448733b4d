// The model's small CUDA kernels (model_kernels.cu) as plain C++: the decode step of a Llama-family
// forward pass on `n` tokens at once (one a request: the serving batch; n = 1 for a single
// sequence), every buffer float32 in device memory except the weights (bf16 bits or float32,
// row-major W [rows][cols] as the checkpoint writes it). Each launcher takes the row count of its
// activations; a row of a batched launch computes exactly what the same launcher computes for that
// row alone (the same order of float operations), so a batched step equals n single steps bit for
// bit outside attention, except gemv's bf16 products over gemm::kGemmMinRows rows or more (the
// tensor-core GEMM below: its own summation order and x's 2^-16 split, the same bits every run).
//
//   gemv         y[b][r] (+)= sum_c W[r][c] x[b][c] for b < n: one warp a weight row, 16-byte
//                loads (8 bf16 or 4 fp32 weights a lane) where the row allows, each weight chunk
//                loaded once for up to kGemvCols activation rows, float32 accumulation, a fixed
//                shuffle reduction (the same bits every run); bf16 W at gemm::use_gemm's row
//                counts and shapes goes to gemm_bf16
//   gemm_bf16    the same product on tensor cores (kernels/cuda/gemm_bf16.h): mma.m16n8k16 over
//                cp.async tiles of W as stored, x split into high + low bf16 (two mmas), float32
//                accumulation, split-K where the output's blocks cannot fill the SMs
//   embed_row(s) out[b] = W[id_b] as float32 (ids in device memory for a batch)
//   rms_norm     each of `rows` rows of `dim` values (in `groups` groups at a stride): x * w /
//                sqrt(mean(x^2) + eps) (the model's final / block norms: one row a token; qwen3's
//                q/k norm: rows = heads, dim = head_dim, a group a token)
//   add          x[b] += b (biases)
//   rope         each head's channel pairs rotated by host-computed angles (RopeAngles): one set
//                for every row, or one a row read from device memory (a batch's own positions)
//   silu_mul     g = g / (1 + exp(-g)) * u
//   to_bf16      out = float_to_bf16_bits(x) (core/half.h's own __host__ __device__ rounding:
//                nearest even, NaN kept), for backend cuda's bf16 cache side (device_side.cpp);
//                to_bf16_jobs converts up to kBf16Jobs (source, destination) pairs in one launch
//                (a serving step's appends)
//
// The host-side arithmetic they take (rope angles and channel pairs, the gemv's launch shape) is
// here as inline functions, so that host tests check it without a device
// (tests/kernels/cuda/model_kernels_test.cpp). Every launcher queues on the legacy default stream
// and throws kvq::Error (kernels/cuda/cuda_check.h) when a launch fails.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <utility>

#include "core/error.h"
#include "core/hostdev.h"

namespace kvq::cuda::model {

/// \brief The most channel pairs a head rotates (head_dim <= 256): RopeAngles' capacity.
inline constexpr int kMaxRopePairs = 128;

/// \brief One position's rotation: cos and sin of position x inv_freq[i] for each channel pair i,
/// passed to the kernel by value (2 x 512 bytes of kernel parameters).
struct RopeAngles {
  float cs[kMaxRopePairs];
  float sn[kMaxRopePairs];
};

#if !defined(__CUDACC__)  // host code only (kvq::fail is not in CUDA translation units)
/// \brief The angles at position `pos`, computed as LlamaModel::rope does on the CPU (the angle in
/// double, cos and sin in double, then rounded to float), so the device rotation multiplies by
/// the same float factors.
inline RopeAngles rope_angles(std::span<const float> inv_freq, int64_t pos) {
  KVQ_CHECK(inv_freq.size() <= static_cast<size_t>(kMaxRopePairs),
            "rope: {} channel pairs, the CUDA model takes at most {} (head_dim <= {})",
            inv_freq.size(), kMaxRopePairs, 2 * kMaxRopePairs);
  RopeAngles a{};
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double t = static_cast<double>(pos) * inv_freq[i];
    a.cs[i] = static_cast<float>(std::cos(t));
    a.sn[i] = static_cast<float>(std::sin(t));
  }
  return a;
}
#endif

/// \brief The channels (a, b) of pair i in a head of `dim` channels: rotate_half's (i, i + dim/2)
/// when `half` (checkpoint folders), else adjacent (2i, 2i + 1) (GGUF).
KVQ_HD void rope_pair(int64_t i, int64_t dim, bool half, int64_t& a, int64_t& b) {
  a = half ? i : 2 * i;
  b = half ? i + dim / 2 : 2 * i + 1;
}

/// \brief One pair rotated: (x0 cos - x1 sin, x0 sin + x1 cos). On the device each product is
/// rounded before the sum (__fmul_rn / __fadd_rn: no fused multiply-add), as the CPU's plain
/// expression is without contraction.
KVQ_HD void rope_rotate(float& x0, float& x1, float cs, float sn) {
  const float a = x0, b = x1;
#ifdef __CUDA_ARCH__
  x0 = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
  x1 = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
#else
  x0 = a * cs - b * sn;
  x1 = a * sn + b * cs;
#endif
}

/// \brief The gemv's launch shape: kGemvWarps warps a block, one output row a warp; a warp loads
/// each weight chunk once for up to kGemvCols activation rows (registers: kGemvCols sums a lane).
inline constexpr int kGemvWarps = 8;
inline constexpr int kGemvCols = 8;
/// \brief Passes over the activation rows a warp makes for n rows (each re-reads its weight row,
/// from cache after the first).
inline int64_t gemv_passes(int64_t n) { return (n + kGemvCols - 1) / kGemvCols; }
inline int64_t gemv_blocks(int64_t rows) { return (rows + kGemvWarps - 1) / kGemvWarps; }
/// \brief Weights a lane loads at once when a row allows 16-byte loads: 8 bf16 or 4 float32.
inline constexpr int vec_width(bool bf16) { return bf16 ? 8 : 4; }
/// \brief Whether rows of `cols` weights (each row starting 16-byte aligned when the matrix does)
/// and x rows `ldx` floats apart (0: cols) take the vector path: cols a multiple of the vector
/// width and ldx of 4 floats (16 bytes). Else every lane loads one weight at a time (correct for
/// any cols, slower).
inline bool gemv_vectorized(int64_t cols, bool bf16, int64_t ldx = 0) {
  return cols % vec_width(bf16) == 0 && (ldx == 0 || ldx % 4 == 0);
}
/// \brief Most (source, destination) pairs one to_bf16_jobs launch converts.
inline constexpr int kBf16Jobs = 64;

// ---- launchers (model_kernels.cu) --------------------------------------------------------------

/// \brief y [n][rows] (+)= x [n][cols] W^T: row b of y is W [rows][cols] times row b of x; W bf16
/// bits (`bf16`) or float32. x rows lie `ldx` floats apart (0: cols). `accumulate` adds to y (the
/// residual stream), else y is overwritten. W, x, y 16-byte aligned (cudaMalloc); x and y do not
/// overlap. `tensor_cores` false keeps bf16 W on this kernel at every n (the device tests' and
/// timings' comparison path), else gemm::use_gemm's shapes go to gemm_bf16.
void gemv(const void* w, bool bf16, int64_t rows, int64_t cols, const float* x, float* y,
          bool accumulate, int64_t n = 1, int64_t ldx = 0, bool tensor_cores = true);
/// \brief gemv's product for bf16 W on tensor cores (gemm_bf16.h), whatever n: cols a multiple of
/// 8, ldx (0: cols) of 4, W and x 16-byte aligned (else kvq::Error). gemv calls it where
/// gemm::use_gemm holds; the device tests call it directly.
void gemm_bf16(const uint16_t* w, int64_t rows, int64_t cols, const float* x, float* y,
               bool accumulate, int64_t n = 1, int64_t ldx = 0);
/// \brief out [cols] = row `row` of W [rows][cols] (bf16 bits or float32) as float32.
void embed_row(const void* w, bool bf16, int64_t cols, int64_t row, float* out);
/// \brief out [n][cols] = rows ids[0..n) of W (ids: DEVICE memory, each checked by the caller to
/// lie in [0, rows)).
void embed_rows(const void* w, bool bf16, int64_t cols, const int32_t* ids, int64_t n, float* out);
/// \brief y [rows][dim] = RMSNorm of each row of x with weight w [dim]; y may be x. With `groups`
/// > 1, groups of `rows` rows starting `group_stride` floats apart (x and y alike).
void rms_norm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
              int64_t groups = 1, int64_t group_stride = 0);
/// \brief x [rows][n] += b [n].
void add(float* x, const float* b, int64_t n, int64_t rows = 1);
/// \brief x [heads][dim] rotated in place by `a` (dim / 2 pairs, rope_pair's channels); with
/// rows > 1, `rows` such blocks `ld` floats apart, each by `a`, or by rows_a[r] (DEVICE memory,
/// one RopeAngles a row) when rows_a is given.
void rope(float* x, int64_t heads, int64_t dim, bool half, const RopeAngles& a, int64_t rows = 1,
          int64_t ld = 0, const RopeAngles* rows_a = nullptr);
/// \brief g [rows][n] = SiLU(g) * u, rows `ld` floats apart in both (0: n).
void silu_mul(float* g, const float* u, int64_t n, int64_t rows = 1, int64_t ld = 0);
/// \brief out [n] = float_to_bf16_bits(x [n]) (device memory both).
void to_bf16(const float* x, int64_t n, uint16_t* out);
/// \brief out[j] [n] = float_to_bf16_bits(x[j] [n]) for every j (device memory; x and out the same
/// length, at most kBf16Jobs): one launch.
void to_bf16_jobs(std::span<const float* const> x, std::span<uint16_t* const> out, int64_t n);

}  // namespace kvq::cuda::model
