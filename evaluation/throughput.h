// Throughput of the cache formats as a researcher sweeps it (`kvq run`'s [throughput] task):
// decode attention over a batch of sequences and prefill quantization, per scheme, context and
// backend, timed against a memcpy measured in the same run. The Google Benchmark programs in
// bench/ stay for kernel development; this is the sweep whose rows are plotted.
//
// What one decode step is: `batch` sequences, each one query token (heads x gqa query heads)
// attending over its own cache of `context` tokens. The caches a step reads are cold: each timed
// step reads caches no step has read since at least `pool_bytes` (256 MiB, 8x this machine's L3)
// of other caches went by, as in a model's decode where every other layer's cache and weights
// pass between two reads of one layer. Caches are built once per (scheme, context) from the same
// synthetic K/V (evaluation/synthetic.h; keys with outlier channels).
//
// Backend cuda (decode only): the same pool, of device-resident sides (make_backend_side), at least
// `batch` distinct caches so no two sequences of a step share bytes in the GPU's L2; q and out in
// device memory; each step (one launch per 64 sequences) timed between CUDA events.
#pragma once

#include <cstdint>
#include <vector>

#include "core/spec.h"
#include "core/tensor.h"
#include "kernels/backend.h"

namespace kvq::eval {

struct ThroughputShape {
  int64_t heads = 8, head_dim = 128, gqa = 4;  ///< kv heads, head_dim, query heads per kv head
};

struct ThroughputOptions {
  int threads = 1;  ///< 1: timed in process CPU time; more: wall time
  int repeats = 5;  ///< timed repetitions; the median is reported
  double pool_bytes = 256.0 * (1 << 20);
};

/// \brief The K/V (and query) every scheme of one context is built from.
struct ThroughputInput {
  ThroughputShape shape;
  int64_t context = 0;
  Tensor3 k, v;
  std::vector<float> q;  ///< [heads * gqa, head_dim]
};
ThroughputInput throughput_input(const ThroughputShape& shape, int64_t context, uint64_t seed);

struct Timing {
  double us = 0;     ///< median time of one decode step (all sequences) or one quantization
  double bytes = 0;  ///< bytes that time moves: stored K+V bytes read (decode), float32 input
                     ///< bytes (quantize)
  double stored_bytes_per_token = 0;  ///< the format's K+V bytes per token of one sequence
  int64_t distinct_caches = 0;        ///< caches built for the decode pool
  double page_faults = 0;  ///< minor page faults per timed repetition (median; quantize)
  const char* clock = "";  ///< "process CPU time", "wall time" or "CUDA events"
};

/// \brief One decode step of `batch` sequences on `backend` (the median of opt.repeats); on a
/// device backend (cuda) the caches live in device memory (see the file comment).
Timing time_decode(const SchemeSpec& spec, const ThroughputInput& in, int64_t batch,
                   AttentionBackend backend, const ThroughputOptions& opt);

/// \brief Quantizing the whole context of K and V into fresh sides (one append each, as a
/// prefill does) with `backend`'s quantizers (the median of opt.repeats). Host backends only.
Timing time_quantize(const SchemeSpec& spec, const ThroughputInput& in, AttentionBackend backend,
                     const ThroughputOptions& opt);

/// \brief memcpy bandwidth in GB/s (10^9 bytes copied per second) of a `bytes`-byte buffer, the
/// median of `repeats`, timed as opt.threads says.
double memcpy_gbps(double bytes, const ThroughputOptions& opt);

}  // namespace kvq::eval
