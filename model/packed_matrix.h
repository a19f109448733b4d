// The model's weights, kept in their GGUF block format and packed once at load into panels of 64
// output columns, multiplied by a row-deterministic product.
//
// Every output element y[r][c] is the fused multiply-add chain
//     acc = (accumulate ? y[r][c] : 0);  for k = 0 .. in-1: acc = fma(x[r][k], W[c][k], acc)
// in increasing k, whatever the number of rows, the tile, the kernel (decode or prefill) or the
// thread - so a token's activations are bit-identical whether it runs in a chunk of 512, a chunk
// of 7 or alone, and chunked prefill stores exactly the quantized codes token-by-token decode
// stores. W[c][k] is the value gguf::dequantize_row gives for that weight: the kernels decode
// it in registers with the same expression (for Q4_1 `d * q + m`, where d * q is exact in fp32,
// so a fused or a separate add give the same float).
//
// Layouts (per panel of 64 columns, per block of 32 consecutive k):
//   Q4_1 / Q4_0: fp16 d[64] (and m[64] for Q4_1), then 16 byte rows: byte c of row j holds the
//                codes of column c for k = 2j (low nibble) and 2j + 1 (high nibble).
//                Q4_1: 1,280 bytes per 2,048 weights = 5 bits/weight, as in the file.
//   Q8_0:        fp16 d[64], then 32 rows of 64 int8 codes: 8.5 bits/weight, as in the file.
//   F32:         fp32 panels, [k][64] floats (the tile itself).
//   F16 / BF16:  16-bit panels, [k][64] of the file's values, converted exactly into a tile (half
//                the memory of fp32 panels; the same values, so the same logits).
//   other types: the file's own blocks, the 64 columns' blocks of each k-block side by side,
//                decoded by gguf::dequantize_row into a tile.
//   mapped:      F32 / F16 / BF16 W [out][in] row-major where it lies (a checkpoint's mapped
//                safetensors), not copied: a shared owner keeps the mapping alive. A panel is 64
//                consecutive rows; a block of 16 rows x 32 k (16 for F32) is transposed in
//                registers (AVX-512: a 16 x 16 transpose of 32-bit words, a word holding two
//                16-bit k values, split exactly into floats by a shift and a mask, or F16C), then
//                enters the same chain: straight into the accumulators when decoding (m < 4),
//                into the tile for the prefill kernel. The avx2 and portable paths transpose
//                into the tile.
// A last panel narrower than 64 columns is padded with zero weights that are never stored.
// The kernels are compiled once per CPU path (portable, avx2: AVX2 + FMA + F16C, avx512, ...) and
// run the path backend cpu runs, chosen once per process from the CPU's features or KVQ_CPU_PATH
// (model/packed_kernels.h, kernels/cpu/isa.h); every path gives the same floats.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/gguf.h"
#include "model/packed_kernels.h"

namespace kvq {

/// \brief A weight matrix W [out][in] (a GGUF tensor with dims {in, out}) in column panels.
class PackedMatrix {
 public:
  static constexpr int64_t kPanel = packed::kPanel;  ///< output columns per panel

  PackedMatrix() = default;  ///< empty (0 x 0)

  /// \brief Packs tensor `t` of `f` (any type gguf::dequantize_row decodes); `in` must be a
  /// multiple of the type's block size.
  static PackedMatrix from_gguf(const gguf::GgufFile& f, const gguf::TensorInfo& t);
  /// \brief An fp32 matrix given row-major as W [out][in] (the reference the tests compare with).
  static PackedMatrix from_rows(const float* w, int64_t out, int64_t in);
  /// \brief W [out][in] given row-major as F32, F16 or BF16 values (a GGUF tensor's data or a
  /// safetensors tensor's, read in place) into fp32 or 16-bit panels; format() names `type`.
  static PackedMatrix from_dense(const uint8_t* w, gguf::GgmlType type, int64_t out, int64_t in);
  /// \brief W [out][in] row-major as F32, F16 or BF16 values multiplied where they lie (no copy);
  /// `owner` keeps `w`'s memory (a file mapping) alive as long as the matrix. Every product and
  /// row equals from_dense's bit for bit (the same values in the same chain).
  static PackedMatrix from_mapped(const uint8_t* w, gguf::GgmlType type, int64_t out, int64_t in,
                                  std::shared_ptr<const void> owner);

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  /// \brief Bytes of the weights: held in panels, or mapped (mapped()).
  size_t bytes() const { return data_.size() + mapped_bytes_; }
  /// \brief Whether the weights are read in place from memory the matrix does not own.
  bool mapped() const { return kind_ == Kind::kMapped; }
  /// \brief "Q4_1 (panels)", "F32 (panels)", "BF16 (mapped rows)", "Q6_K (file blocks)" ...
  std::string format() const;

  /// \brief y [m][out] (=, or += when `accumulate`) x [m][in] W^T, each element the fixed chain
  /// above, with an OpenMP team over the panels.
  void multiply(const float* x, int64_t m, float* y, bool accumulate = false) const;
  /// \brief The share of multiply() of one member of a team of `members` threads (a contiguous
  /// range of panels); the caller synchronizes.
  void multiply(const float* x, int64_t m, float* y, bool accumulate, int member,
                int members) const;
  /// \brief out[k] = W[c][k] for k < in (an embedding lookup).
  void weight_row(int64_t c, float* out) const;
  /// \brief The CPU path whose kernels the products run: backend cpu's (kvq::cpu::path(),
  /// kernels/cpu/isa.h), chosen once per process; every path gives the same floats.
  static const char* cpu_path();

 private:
  using Kind = packed::Kind;
  static PackedMatrix dense_shape(Kind kind, gguf::GgmlType type, int64_t out, int64_t in,
                                  const char* who);
  packed::Layout layout() const;  ///< what the kernels read (model/packed_kernels.h)

  Kind kind_ = Kind::kF32;
  gguf::GgmlType type_ = gguf::GgmlType::kF32;
  int64_t in_ = 0, out_ = 0, panels_ = 0;
  int64_t kblock_ = 0;       ///< k values per block (32 for panels, the type's block otherwise)
  int64_t kblocks_ = 0;      ///< blocks along k
  int64_t block_bytes_ = 0;  ///< bytes of one (panel, k-block): 64 columns' worth
  int64_t file_block_bytes_ = 0;
  std::vector<uint8_t> data_;
  const uint8_t* rows_ = nullptr;      ///< Kind::kMapped: W [out][in], row-major
  std::shared_ptr<const void> owner_;  ///< Kind::kMapped: keeps rows_ alive
  size_t mapped_bytes_ = 0;            ///< Kind::kMapped: out * in * item
};

}  // namespace kvq
