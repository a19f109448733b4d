// How each scheme family is stored and round-tripped (issue 48, item 1): one record per family of
// core/schemes.h's registry, in the manner of ggml's type_traits_cpu beside type_traits. A
// family's record lives in its folder, schemes/<family>/storage.cpp, with its SideStore; the one
// table, cache/schemes.cpp, is built from schemes/families.def. make_side and round_trip (side.h,
// round_trip.h) wrap what every scheme shares (per-layer specs, k=;v= sides, rot=, sink=) around
// it. The reads of a stored side are the backends' (the reference's: reference_cpu/reads.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cache/side.h"
#include "core/safetensors.h"
#include "core/spec.h"
#include "core/stored_side.h"
#include "core/tensor.h"

namespace kvq {

/// \brief What one side stores, as `kvq quant --codes` writes it: raw tensors (codes or packed
/// words, scales, minima, values) and string metadata naming their layout.
struct StoredBytes {
  std::vector<RawTensor> tensors;
  std::map<std::string, std::string> meta;
  /// \brief Appends tensor `name` of `dtype` and `shape` holding `bytes` bytes from `p`.
  void add(std::string name, std::string dtype, std::vector<int64_t> shape, const void* p,
           int64_t bytes) {
    tensors.push_back({std::move(name), std::move(dtype), std::move(shape),
                       std::string(static_cast<const char*>(p), static_cast<size_t>(bytes))});
  }
};

struct SchemeStorage {
  std::string_view family;  ///< SchemeTraits::family of core/schemes.h
  /// \brief A side of one-side spec `spec` (no rot=, no sink=); make_side's contract.
  std::unique_ptr<SideStore> (*make_side)(const SchemeSpec& spec, Role role, int64_t heads,
                                          int64_t dim, int layer, const SideKernels& kernels);
  /// \brief `x` quantized and read back as one layer's tensor in `role` (no rot=, no sink=): the
  /// values of round_trip (round_trip.h).
  Tensor3 (*round_trip)(const SchemeSpec& spec, Role role, const Tensor3& x, int layer);
  /// \brief Adds to `out` the bytes of a stored view of the family (`s.kind` one of its kinds)
  /// whose first `quantized` tokens are coded; returns the tokens they cover (the caller adds the
  /// exact values of the rest).
  int64_t (*stored_bytes)(const StoredSide& s, int64_t quantized, StoredBytes& out);
  /// \brief Makes one-side spec `spec` that of a side quantizing a whole tensor of `tokens` (> 0,
  /// after the sinks) tokens at once, as its own prefill (fp8: dynamic first=N scales from the
  /// first min(N, tokens)); null: the spec as it is.
  void (*whole_tensor)(SchemeSpec& spec, int64_t tokens) = nullptr;
};

/// \brief The storage of a kind's family; throws kvq::Error when the family registered in core
/// has no storage here.
const SchemeStorage& scheme_storage(SchemeKind kind);

}  // namespace kvq
