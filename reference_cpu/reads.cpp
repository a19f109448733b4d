#include "reference_cpu/reads.h"

#include <algorithm>
#include <array>
#include <vector>

#include "core/rotation.h"
#include "core/schemes.h"
#include "reference_cpu/dense_ops.h"

namespace kvq {

// Each family's reads: k<Name>Reads in schemes/<family>/reads.cpp, one per line of
// schemes/families.def.
#define KVQ_SCHEME_FAMILY(folder, Name, ...) extern const SchemeReads k##Name##Reads;
#include "schemes/families.def"
#undef KVQ_SCHEME_FAMILY

namespace {

const std::array kReads{
#define KVQ_SCHEME_FAMILY(folder, Name, ...) &k##Name##Reads,
#include "schemes/families.def"
#undef KVQ_SCHEME_FAMILY
};

// The view of the tokens after the sinks, indexed from 0 there.
StoredSide without_sinks(const StoredSide& s) {
  StoredSide r = s;
  r.tokens -= s.sink_tokens;
  r.sink = nullptr;
  r.sink_tokens = 0;
  return r;
}

}  // namespace

const SchemeReads& scheme_reads(SchemeKind kind) {
  return family_record<SchemeReads>(kReads, kind,
                                    "the reference's reads (reference_cpu/reads.cpp)");
}

void stored_dot(const StoredSide& k, int64_t h, const float* q, int nq, int64_t t0, int64_t t1,
                float* s, int64_t ld) {
  const int64_t S = k.sink_tokens;
  if (S == 0) return scheme_reads(k.kind).dot(k, h, q, nq, t0, t1, s, ld);
  // sink=S: the first S tokens exact, the scheme's own side from token S on (its token 0).
  const int64_t m = std::clamp(S, t0, t1);
  if (m > t0) dense_dot(k.sink, k.heads, k.dim, h, q, nq, t0, m, s, ld);
  if (t1 > m) scheme_reads(k.kind).dot(without_sinks(k), h, q, nq, m - S, t1 - S, s + (m - t0), ld);
}

void stored_accumulate(const StoredSide& v, int64_t h, const float* p, int nq, int64_t t0,
                       int64_t t1, int64_t ld, float* out) {
  const int64_t S = v.sink_tokens;
  if (S == 0) return scheme_reads(v.kind).accumulate(v, h, p, nq, t0, t1, ld, out);
  const int64_t m = std::clamp(S, t0, t1);
  if (m > t0) dense_accumulate(v.sink, v.heads, v.dim, h, p, nq, t0, m, ld, out);
  if (t1 > m)
    scheme_reads(v.kind).accumulate(without_sinks(v), h, p + (m - t0), nq, m - S, t1 - S, ld, out);
}

void side_dot(const SideStore& k, int64_t h, const float* q, int nq, int64_t t0, int64_t t1,
              float* s, int64_t ld) {
  const Rotation* r = k.rotation();
  if (!r) return stored_dot(k.stored(), h, q, nq, t0, t1, s, ld);
  // rot=: the side stores R k, and <R q, R k> = <q, k>.
  std::vector<float> rq(q, q + nq * k.dim());
  r->rotate(rq.data(), nq);
  stored_dot(k.stored(), h, rq.data(), nq, t0, t1, s, ld);
}

void side_accumulate(const SideStore& v, int64_t h, const float* p, int nq, int64_t t0, int64_t t1,
                     int64_t ld, float* out) {
  const Rotation* r = v.rotation();
  if (!r) return stored_accumulate(v.stored(), h, p, nq, t0, t1, ld, out);
  // rot=: the sum of R v is R times the sum of v; rotated back, then added.
  std::vector<float> o(static_cast<size_t>(nq * v.dim()), 0.0f);
  stored_accumulate(v.stored(), h, p, nq, t0, t1, ld, o.data());
  r->unrotate(o.data(), nq);
  for (size_t i = 0; i < o.size(); ++i) out[i] += o[i];
}

}  // namespace kvq
