// The `kvq` subcommands; each registers itself on the top-level CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace kvq::cli {

void register_quant(CLI::App& app);
void register_compare(CLI::App& app);
void register_synth(CLI::App& app);
void register_plan(CLI::App& app);
void register_model(CLI::App& app);
void register_run(CLI::App& app);

}  // namespace kvq::cli
