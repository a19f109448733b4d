// The reference's attention reads of a cache side (cache/side.h): the scalar definition of what
// every backend's kernels compute over the same stored bytes. A read covers tokens [t0, t1) of kv
// head h for nq query vectors at once (the GQA group shares each unpacked code). The side's stored
// view (core/stored_side.h) is read directly: the dequantized cache is never built on this path.
// Each scheme family's reads are in its folder, schemes/<family>/reads.cpp, one record per family
// of core/schemes.h's registry (SchemeReads), in reads.cpp's table (built from
// schemes/families.def); sink= and rot= are read here, once for every family.
#pragma once

#include <cstdint>
#include <string_view>

#include "cache/side.h"
#include "core/stored_side.h"

namespace kvq {

/// \brief scores[i * ld + (t - t0)] = <q_i, K[t, h, :]> for t in [t0, t1), i < nq; q is
/// [nq, dim] in the model's basis (a rot= side's query is rotated here). Unscaled (no 1/sqrt(d)).
void side_dot(const SideStore& k, int64_t h, const float* q, int nq, int64_t t0, int64_t t1,
              float* scores, int64_t ld);
/// \brief out[i * dim + d] += sum_t p[i * ld + (t - t0)] * V[t, h, d] for t in [t0, t1), in the
/// model's basis (a rot= side's sum is rotated back here).
void side_accumulate(const SideStore& v, int64_t h, const float* p, int nq, int64_t t0, int64_t t1,
                     int64_t ld, float* out);

/// \brief side_dot / side_accumulate over a stored view as it is (no rotation): the sinks, then
/// the family's read of the rest.
void stored_dot(const StoredSide& k, int64_t h, const float* q, int nq, int64_t t0, int64_t t1,
                float* scores, int64_t ld);
void stored_accumulate(const StoredSide& v, int64_t h, const float* p, int nq, int64_t t0,
                       int64_t t1, int64_t ld, float* out);

/// \brief How the reference reads a stored view of one family (`s.kind` one of its kinds, no
/// sinks: stored_dot splits them off); the contracts of stored_dot and stored_accumulate.
struct SchemeReads {
  std::string_view family;  ///< SchemeTraits::family of core/schemes.h
  void (*dot)(const StoredSide& s, int64_t h, const float* q, int nq, int64_t t0, int64_t t1,
              float* scores, int64_t ld);
  void (*accumulate)(const StoredSide& s, int64_t h, const float* p, int nq, int64_t t0, int64_t t1,
                     int64_t ld, float* out);
};

/// \brief The reads of a kind's family; throws kvq::Error when the family registered in core has
/// no reads here.
const SchemeReads& scheme_reads(SchemeKind kind);

}  // namespace kvq
