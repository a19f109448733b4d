// The model's packed products (model/packed_matrix.h) split as backend cpu's kernels are: the
// packing and the matrix's bookkeeping are compiled once for the baseline (packed_matrix.cpp); the
// kernels that multiply a panel or decode a tile (packed_kernels.cpp) are compiled once per CPU
// path with that path's flags into namespace kvq::packed::<path> (cmake/cpu_paths.cmake), each
// path filling one Kernels table. kernels() takes the table of the path backend cpu runs
// (kvq::cpu::path(), kernels/cpu/isa.h: chosen once per process from the CPU's features, or
// KVQ_CPU_PATH), so the model and the attention kernels always run one path. Every path computes
// the same chain (packed_matrix.h), so every path gives the same floats. Internal to model/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/gguf.h"

namespace kvq::packed {

constexpr int64_t kPanel = 64;   ///< output columns per panel
constexpr int64_t kQK = 32;      ///< values per block of the legacy ggml formats
constexpr int64_t kChunk = 256;  ///< k values per decoded tile: 256 x 64 floats = 64 KB in L2

/// \brief How a matrix holds its weights (packed_matrix.h's layouts).
enum class Kind { kQ4_1, kQ4_0, kQ8_0, kF32, k16, kBlocks, kMapped };

// ---- the panel blocks (one per panel and 32 values of k) -------------------------------------

struct PanelQ4_1 {  // W = d * q + m
  uint16_t d[kPanel], m[kPanel];
  uint8_t qs[kQK / 2][kPanel];  // qs[j][c]: column c, k = 2j (low nibble) and 2j + 1 (high nibble)
};
static_assert(sizeof(PanelQ4_1) == 1280, "5 bits per weight, as Q4_1 in the file");

struct PanelQ4_0 {  // W = d * (q - 8)
  uint16_t d[kPanel];
  uint8_t qs[kQK / 2][kPanel];
};
static_assert(sizeof(PanelQ4_0) == 1152, "4.5 bits per weight, as Q4_0 in the file");

struct PanelQ8_0 {  // W = d * q
  uint16_t d[kPanel];
  int8_t qs[kQK][kPanel];
};
static_assert(sizeof(PanelQ8_0) == 2176, "8.5 bits per weight, as Q8_0 in the file");

/// \brief Bytes of one value of a dense (mapped or 16-bit / fp32 panel) matrix.
inline size_t dense_item(gguf::GgmlType type) { return type == gguf::GgmlType::kF32 ? 4 : 2; }

/// \brief What a kernel reads of a PackedMatrix (its fields, packed_matrix.h).
struct Layout {
  Kind kind;
  gguf::GgmlType type;
  int64_t in, out, panels;
  int64_t kblock;            ///< k values per block (32 for panels, the type's block otherwise)
  int64_t kblocks;           ///< blocks along k
  int64_t block_bytes;       ///< bytes of one (panel, k-block): 64 columns' worth
  int64_t file_block_bytes;  ///< Kind::kBlocks: bytes of one of the file's blocks
  const uint8_t* data;       ///< the panels (not Kind::kMapped)
  const uint8_t* rows;       ///< Kind::kMapped: W [out][in], row-major

  const uint8_t* block_ptr(int64_t p, int64_t kb) const {
    return data + static_cast<size_t>((p * kblocks + kb) * block_bytes);
  }
};

/// \brief One CPU path's kernels.
struct Kernels {
  const char* path;  ///< the CPU path's name (kernels/cpu/isa.h PathInfo::name)
  /// One panel p for all m rows of x [m][in]: y (the panel's first column, row stride `out`) =,
  /// or += when `accumulate`, the chain.
  void (*panel)(const Layout& l, int64_t p, const float* x, int64_t m, float* y, bool accumulate);
  /// tile[(k - k0) * 64 + c] = W[p * 64 + c][k] for k in [k0, k1) (on block boundaries).
  void (*decode_tile)(const Layout& l, int64_t p, int64_t k0, int64_t k1, float* tile);
};

/// \brief The table of the CPU path this process runs (kvq::cpu::path()).
const Kernels& kernels();

}  // namespace kvq::packed
