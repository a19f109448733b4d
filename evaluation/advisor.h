// kvq advise: which KV-cache scheme to serve with, decided from measurements. The planner
// (evaluation/planner.h) gives each scheme's capacity and decode-step bound for the workload;
// the quality comes from the model rows of `kvq run` results directories (KLD and perplexity
// against the fp32 cache, measured, never guessed). The rule, the design note's own advice:
//   1. a scheme is eligible when its measured quality meets the budget (--max-kld, --max-dppl) at
//      the context nearest the workload's; schemes without a measurement are not considered, and
//      a row whose scored positions read less than eval::kMinQuantizedFraction of their K/V
//      quantized (a residual window or FP8 first-N prefix covering its windows) is no measurement:
//      it is skipped with its reason;
//   2. the answer is the eligible scheme with the most decode tokens/s at the workload (the batch
//      capped by the requests that fit), ties to the lower KLD;
//   3. "do not quantize" (bf16, what serving engines store) when bf16 holds the whole batch and the
//      answer would gain less than `min_gain` over it (short contexts, small batches, memory to
//      spare: the step is bound by the weights), or when no quantized scheme meets the budget.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "evaluation/planner.h"

namespace kvq::advisor {

/// \brief One measured quality of a scheme (a `kvq run` model row).
struct Quality {
  std::string scheme;  ///< canonical spec
  int64_t ctx = 0;     ///< the window it was measured at (settings.ctx)
  double kld = 0, delta_ppl = 0, top1 = 0;
  /// The row's "quantized" (eval::quantized_fraction); for rows written before kvq recorded it,
  /// computed from the row's settings; unknown (nullopt) when those cannot tell.
  std::optional<double> quantized;
  std::string source;  ///< DIR/model.jsonl
  int line = 0;        ///< its line there
};

/// \brief The model rows of each directory's model.jsonl (throws naming a directory without one or
/// a row without kld / delta_ppl / settings.ctx).
std::vector<Quality> read_quality(const std::vector<std::string>& dirs);

struct Budget {
  std::optional<double> max_kld, max_dppl;
};

/// \brief One scheme's line of the decision table.
struct Candidate {
  std::string scheme;
  std::optional<Quality> quality;  ///< the row used (nearest ctx, the worst if several)
  planner::PlanRow plan;
  bool eligible = false;
  std::string why;  ///< why not eligible, or "-"
};

struct Advice {
  planner::Plan plan;
  std::vector<Candidate> table;  ///< bf16 first, then by tokens/s
  std::string choice;            ///< a canonical spec; "bf16" for "do not quantize"
  bool quantize = false;
  std::vector<std::string> reasons;  ///< the lines that explain the choice
  /// Rows not used, each with why ("FILE:LINE: SCHEME at ctx N: only X% ... quantized ...").
  std::vector<std::string> skipped;
};

/// \brief min_gain: the speed-up over bf16 below which quantizing is not worth it when bf16 fits.
/// `in.kv` is replaced by bf16 and every scheme that has a quality row; `in.ctx` and
/// `in.decode_ctx` are the workload's context, `in.batch` its batch.
Advice advise(planner::PlanInput in, const std::vector<Quality>& rows, const Budget& b,
              double min_gain = 1.10);

/// \brief The report: the workload, the table the decision was made from, the answer and why.
std::string format_advice(const Advice& a, const Budget& b);

}  // namespace kvq::advisor
