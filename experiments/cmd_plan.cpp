// kvq plan: placeholder until the planner lands in this file.
#include "experiments/commands.h"

namespace kvq::cli {
void register_plan(CLI::App& app) { app.add_subcommand("plan", "capacity and bandwidth planner"); }
}  // namespace kvq::cli
