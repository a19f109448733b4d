// The `kvq` subcommands; each registers itself on the top-level CLI11 app.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "evaluation/defaults.h"
#include "evaluation/planner.h"

namespace kvq::cli {

void register_quant(CLI::App& app);
void register_compare(CLI::App& app);
void register_synth(CLI::App& app);
void register_plan(CLI::App& app);
void register_model(CLI::App& app);
void register_run(CLI::App& app);
void register_stats(CLI::App& app);
void register_advise(CLI::App& app);

/// \brief The planner's model, GPU, memory and weight flags (kvq plan and kvq advise share them).
struct PlanFlags {
  struct Values {
    planner::PlanInput in;
    std::string model, gpu, mem, weights;
    int64_t layers = 0, kv_heads = 0, head_dim = 0;
    double params = 0, bandwidth = 0;
  };
  CLI::Option *model = nullptr, *layers = nullptr, *kv_heads = nullptr, *head_dim = nullptr,
              *params = nullptr, *mem = nullptr, *gpu = nullptr, *bw = nullptr,
              *weights = nullptr, *weights_dtype = nullptr;
  const Values* values = nullptr;
  /// \brief The plan input those flags give (throws kvq::Error on bad combinations).
  planner::PlanInput resolve() const;
};
/// \brief Adds --model, --layers, --kv-heads, --head-dim, --params, --mem, --gpu, --bandwidth,
/// --weights-bytes and --weights-dtype to `c`, writing into `v` (which must outlive the app).
PlanFlags add_plan_flags(CLI::App* c, PlanFlags::Values& v);
/// \brief kvq plan's footer: how the numbers are made, the model and GPU presets, examples.
std::string plan_footer();

/// \brief --weights (kvq model, kvq run; the config's `weights`, Python's weights=): how a
/// checkpoint folder's weights are held (LlamaModel's WeightStore, parse_weight_store).
inline constexpr const char* kWeightsHelp =
    "how a checkpoint folder's F32/F16/BF16 weights are held: mapped (multiplied where they lie in "
    "the mapped *.safetensors, never copied: the file's pages, shared with the page cache), packed "
    "(copied into 16-bit / fp32 column panels at load) or fp32 (the plain reference product, 2x a "
    "bf16 file); the same logits bit for bit. Under mapped, GGUF blocks and FP8 weights are packed";

/// \brief A bad command line found after parsing (a flag missing or two that conflict): one line
/// naming the command's --help and exit status 2, as CLI11's own usage errors.
template <typename... A>
[[noreturn]] void usage_error(fmt::format_string<A...> f, A&&... a) {
  throw CLI::ValidationError(fmt::format(f, std::forward<A>(a)...));
}

/// \brief Thrown when the user stops a long command (Ctrl-C); main prints it and exits 130.
struct Interrupted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// \brief While one lives, the first Ctrl-C sets a flag that check_stop() turns into Interrupted at
/// the next unit of work (a row, a chunk, a window), so the command can say what was kept and how to
/// go on; a second Ctrl-C kills at once. The default handler is back when it dies.
class StopOnCtrlC {
 public:
  StopOnCtrlC();
  ~StopOnCtrlC();
  StopOnCtrlC(const StopOnCtrlC&) = delete;
  StopOnCtrlC& operator=(const StopOnCtrlC&) = delete;
};
/// \brief Throws Interrupted("interrupted") once Ctrl-C was pressed under a StopOnCtrlC.
void check_stop();

/// \brief The version and commit of the running binary (main sets it; `kvq run` rows record it).
void set_build_version(std::string v);
const std::string& build_version();
/// \brief "host: CPU model x N cores" from /proc/cpuinfo, for the record of a run.
std::string machine_name();

/// \brief A whole number >= `min`, rejected with a plain message ("must be at least 1, got -3")
/// where CLI11's own range checks print the type's maximum, a 300-digit number.
CLI::Validator at_least(long long min);
/// \brief A number > 0, with a plain message.
CLI::Validator above_zero();

/// \brief A file a command writes: the flag or argument that names it, its path (empty: not asked
/// for) and the extension its format needs (".npy", ".safetensors", ".json", ".csv").
struct OutputFile {
  std::string_view what;
  const std::string& path;
  std::string_view ext;
};
/// \brief Before any work: every output asked for ends in its extension and names neither an input
/// (FILE.safetensors:TENSOR counts as FILE; the same file under another name or a hard link
/// counts) nor another output; kvq::Error naming both otherwise. Nothing already written is lost
/// to a slip of the argument order.
void check_outputs(std::initializer_list<std::string_view> inputs,
                   std::initializer_list<OutputFile> outputs);

}  // namespace kvq::cli
