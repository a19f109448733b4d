#include "model/packed_matrix.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <string_view>

#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "model/packed_kernels.h"

// Each CPU path's kernel table (model/packed_kernels.cpp), as backend cpu's paths
// (kernels/cpu/dispatch.cpp): cmake/cpu_paths.cmake compiles one per KVQ_CPU_PATHS entry and
// defines KVQ_CPU_BUILT as the list of them (KVQ_CPU_BUILT_PATH(name) each).
#define KVQ_CPU_BUILT_PATH(name) extern "C" const kvq::packed::Kernels* kvq_packed_path_##name();
KVQ_CPU_BUILT
#undef KVQ_CPU_BUILT_PATH

namespace kvq {

namespace packed {

const Kernels& kernels() {
  static const Kernels& k = []() -> const Kernels& {
    constexpr const Kernels* (*kPaths[])() = {
#define KVQ_CPU_BUILT_PATH(name) kvq_packed_path_##name,
        KVQ_CPU_BUILT
#undef KVQ_CPU_BUILT_PATH
    };
    const std::string_view want = cpu::path().name;
    for (auto table : kPaths)
      if (want == table()->path) return *table();
    fail("PackedMatrix: no kernels for CPU path {} (the model compiles backend cpu's paths: {})",
         want, cpu::compiled_paths());
  }();
  return k;
}

}  // namespace packed

namespace {

using gguf::GgmlType;
using packed::dense_item;
using packed::PanelQ4_0;
using packed::PanelQ4_1;
using packed::PanelQ8_0;
constexpr int64_t P = PackedMatrix::kPanel;
constexpr int64_t QK = packed::kQK;
using packed::kChunk;

// The file's blocks (ggml-common.h); only the fields the packing reads.
struct FileQ4_1 {
  uint16_t d, m;
  uint8_t qs[QK / 2];  // element j: low nibble of qs[j]; element j + 16: high nibble
};
struct FileQ4_0 {
  uint16_t d;
  uint8_t qs[QK / 2];
};
struct FileQ8_0 {
  uint16_t d;
  int8_t qs[QK];
};

uint8_t nibble(const uint8_t* qs, int64_t j) {  // code j of a Q4 block
  return j < QK / 2 ? (qs[j] & 0x0f) : static_cast<uint8_t>(qs[j - QK / 2] >> 4);
}

}  // namespace

// W [out][in] of F32 / F16 / BF16 values (checked), one value per k-block: from_dense's and
// from_mapped's shared fields.
PackedMatrix PackedMatrix::dense_shape(Kind kind, gguf::GgmlType type, int64_t out, int64_t in,
                                       const char* who) {
  KVQ_CHECK(out > 0 && in > 0, "PackedMatrix: empty matrix [{}, {}]", out, in);
  KVQ_CHECK(type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16,
            "PackedMatrix::{}: {} is not F32, F16 or BF16", who,
            gguf::ggml_type_name(static_cast<uint32_t>(type)));
  PackedMatrix pm;
  pm.kind_ = kind;
  pm.type_ = type;
  pm.in_ = in;
  pm.out_ = out;
  pm.panels_ = (out + P - 1) / P;
  pm.kblock_ = 1;
  pm.kblocks_ = in;
  return pm;
}

PackedMatrix PackedMatrix::from_mapped(const uint8_t* w, gguf::GgmlType type, int64_t out,
                                       int64_t in, std::shared_ptr<const void> owner) {
  PackedMatrix pm = dense_shape(Kind::kMapped, type, out, in, "from_mapped");
  pm.rows_ = w;
  pm.owner_ = std::move(owner);
  pm.mapped_bytes_ = static_cast<size_t>(out * in) * dense_item(type);
  return pm;
}

PackedMatrix PackedMatrix::from_rows(const float* w, int64_t out, int64_t in) {
  return from_dense(reinterpret_cast<const uint8_t*>(w), GgmlType::kF32, out, in);
}

PackedMatrix PackedMatrix::from_dense(const uint8_t* w, gguf::GgmlType type, int64_t out,
                                      int64_t in) {
  const int64_t item = type == GgmlType::kF32 ? 4 : 2;
  PackedMatrix pm = dense_shape(item == 4 ? Kind::kF32 : Kind::k16, type, out, in, "from_dense");
  pm.block_bytes_ = P * item;
  pm.data_.assign(static_cast<size_t>(pm.panels_ * in * pm.block_bytes_), 0);
  if (item == 2) {  // the 16-bit values as they are, converted exactly when a tile is decoded
    auto* h = reinterpret_cast<uint16_t*>(pm.data_.data());
    for (int64_t c = 0; c < out; ++c)
      for (int64_t k = 0; k < in; ++k)
        std::memcpy(&h[((c / P) * in + k) * P + c % P], w + (c * in + k) * 2, 2);
    return pm;
  }
  auto* f = reinterpret_cast<float*>(pm.data_.data());
  for (int64_t c = 0; c < out; ++c)
    for (int64_t k = 0; k < in; ++k)
      std::memcpy(&f[((c / P) * in + k) * P + c % P], w + (c * in + k) * 4, 4);
  return pm;
}

PackedMatrix PackedMatrix::from_gguf(const gguf::GgufFile& f, const gguf::TensorInfo& t) {
  KVQ_CHECK(t.dims.size() == 2 && t.dims[0] > 0 && t.dims[1] > 0, "{}: tensor {} is not a matrix",
            f.name(), t.name);
  const gguf::TypeTraits* tr = gguf::type_traits(static_cast<uint32_t>(t.type));
  KVQ_CHECK(tr && tr->dequantizable, "{}: tensor {} has ggml type {}, which kvq cannot decode",
            f.name(), t.name, gguf::ggml_type_name(static_cast<uint32_t>(t.type)));
  const int64_t in = t.dims[0], out = t.dims[1];
  KVQ_CHECK(in % tr->block_elems == 0, "{}: tensor {} rows of {} are not whole {} blocks", f.name(),
            t.name, in, tr->name);
  const uint8_t* src = f.tensor_data(t).data();
  const int64_t row_bytes = in / tr->block_elems * tr->block_bytes;
  if (t.type == GgmlType::kF32 || t.type == GgmlType::kF16 || t.type == GgmlType::kBF16)
    return from_dense(src, t.type, out, in);
  PackedMatrix pm;
  pm.type_ = t.type;
  pm.in_ = in;
  pm.out_ = out;
  pm.panels_ = (out + P - 1) / P;
  const bool q41 = t.type == GgmlType::kQ4_1, q40 = t.type == GgmlType::kQ4_0,
             q80 = t.type == GgmlType::kQ8_0;
  if (q41 || q40 || q80) {
    pm.kind_ = q41 ? Kind::kQ4_1 : q40 ? Kind::kQ4_0 : Kind::kQ8_0;
    pm.kblock_ = QK;
    pm.block_bytes_ = q41 ? sizeof(PanelQ4_1) : q40 ? sizeof(PanelQ4_0) : sizeof(PanelQ8_0);
  } else {
    pm.kind_ = Kind::kBlocks;
    pm.kblock_ = tr->block_elems;
    pm.file_block_bytes_ = tr->block_bytes;
    pm.block_bytes_ = P * tr->block_bytes;
  }
  pm.kblocks_ = in / pm.kblock_;
  pm.data_.assign(static_cast<size_t>(pm.panels_ * pm.kblocks_ * pm.block_bytes_), 0);
  for (int64_t c = 0; c < out; ++c) {
    const int64_t p = c / P, cc = c % P;
    for (int64_t kb = 0; kb < pm.kblocks_; ++kb) {
      uint8_t* dst = pm.data_.data() + (p * pm.kblocks_ + kb) * pm.block_bytes_;
      const uint8_t* fb = src + c * row_bytes + kb * tr->block_bytes;
      if (q41) {
        FileQ4_1 b;
        std::memcpy(&b, fb, sizeof b);
        auto* pb = reinterpret_cast<PanelQ4_1*>(dst);
        pb->d[cc] = b.d;
        pb->m[cc] = b.m;
        for (int64_t j = 0; j < QK / 2; ++j)
          pb->qs[j][cc] =
              static_cast<uint8_t>(nibble(b.qs, 2 * j) | (nibble(b.qs, 2 * j + 1) << 4));
      } else if (q40) {
        FileQ4_0 b;
        std::memcpy(&b, fb, sizeof b);
        auto* pb = reinterpret_cast<PanelQ4_0*>(dst);
        pb->d[cc] = b.d;
        for (int64_t j = 0; j < QK / 2; ++j)
          pb->qs[j][cc] =
              static_cast<uint8_t>(nibble(b.qs, 2 * j) | (nibble(b.qs, 2 * j + 1) << 4));
      } else if (q80) {
        FileQ8_0 b;
        std::memcpy(&b, fb, sizeof b);
        auto* pb = reinterpret_cast<PanelQ8_0*>(dst);
        pb->d[cc] = b.d;
        for (int64_t j = 0; j < QK; ++j) pb->qs[j][cc] = b.qs[j];
      } else {
        std::memcpy(dst + cc * tr->block_bytes, fb, static_cast<size_t>(tr->block_bytes));
      }
    }
  }
  return pm;
}

std::string PackedMatrix::format() const {
  const gguf::TypeTraits* tr = gguf::type_traits(static_cast<uint32_t>(type_));
  const std::string name = tr ? tr->name : "?";
  switch (kind_) {
    case Kind::kF32:
      return name + " (fp32 panels)";
    case Kind::k16:
      return name + " (16-bit panels)";
    case Kind::kBlocks:
      return name + " (file blocks in panels)";
    case Kind::kMapped:
      return name + " (mapped rows)";
    default:
      return name + " (panels)";
  }
}

packed::Layout PackedMatrix::layout() const {
  return {
      kind_,        type_, in_, out_, panels_, kblock_, kblocks_, block_bytes_, file_block_bytes_,
      data_.data(), rows_};
}

const char* PackedMatrix::cpu_path() { return packed::kernels().path; }

void PackedMatrix::weight_row(int64_t c, float* out) const {
  KVQ_CHECK(c >= 0 && c < out_, "PackedMatrix: row {} outside [0, {})", c, out_);
  if (kind_ == Kind::kMapped) {  // the row as it lies, converted exactly
    gguf::dequantize_row(type_, rows_ + static_cast<size_t>(c * in_) * dense_item(type_), in_, out);
    return;
  }
  const int64_t chunk = std::max(kChunk / kblock_, int64_t{1}) * kblock_;
  std::vector<float> tile(static_cast<size_t>(chunk * P));
  const packed::Layout l = layout();
  for (int64_t k0 = 0; k0 < in_; k0 += chunk) {
    const int64_t k1 = std::min(in_, k0 + chunk);
    packed::kernels().decode_tile(l, c / P, k0, k1, tile.data());
    for (int64_t k = k0; k < k1; ++k) out[k] = tile[static_cast<size_t>((k - k0) * P + c % P)];
  }
}

void PackedMatrix::multiply(const float* x, int64_t m, float* y, bool accumulate) const {
  if (m <= 0) return;
  const packed::Layout l = layout();
  const auto panel = packed::kernels().panel;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels_; ++p) panel(l, p, x, m, y + p * P, accumulate);
}

void PackedMatrix::multiply(const float* x, int64_t m, float* y, bool accumulate, int member,
                            int members) const {
  if (m <= 0) return;
  const int64_t p0 = panels_ * member / members, p1 = panels_ * (member + 1) / members;
  const packed::Layout l = layout();
  const auto panel = packed::kernels().panel;
  for (int64_t p = p0; p < p1; ++p) panel(l, p, x, m, y + p * P, accumulate);
}

}  // namespace kvq
