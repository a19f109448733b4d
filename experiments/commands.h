// The `kvq` subcommands; each registers itself on the top-level CLI11 app.
#pragma once

#include <CLI/CLI.hpp>
#include <stdexcept>
#include <string>

#include "experiments/defaults.h"

namespace kvq::cli {

void register_quant(CLI::App& app);
void register_compare(CLI::App& app);
void register_synth(CLI::App& app);
void register_plan(CLI::App& app);
void register_model(CLI::App& app);
void register_run(CLI::App& app);
void register_stats(CLI::App& app);

/// \brief Thrown when the user stops a long command (Ctrl-C); main prints it and exits 130.
struct Interrupted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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

}  // namespace kvq::cli
