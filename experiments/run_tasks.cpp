// The one table of `kvq run`'s tasks: a new task is its file in experiments/tasks/ (a TaskPlan and
// a `Task NAME_task()`, experiments/run_task.h) plus its line here. The order is the order tasks
// are checked, run, merged, counted and listed (and the config keys' order in messages).
#include "experiments/run_task.h"

namespace kvq::cli::run {

Task synthetic_task();
Task model_task();
Task needle_task();
Task throughput_task();
Task ruler_task();
Task serve_task();

const std::vector<Task>& run_tasks() {
  static const std::vector<Task> tasks{synthetic_task(),  model_task(), needle_task(),
                                       throughput_task(), ruler_task(), serve_task()};
  return tasks;
}

}  // namespace kvq::cli::run
