// Shared by the CPU benches: take_flag (a program's own --NAME=VALUE flags), ratio_main and a
// console reporter that prints, after the runs, each case's GB/s (10^9 B/s of float32 input), its
// fraction of the memcpy measured in the same run, and backend cpu's speedup over backend ref for
// the same case. Case names are "BM_<what>/<backend>/<case>"; the copy is "BM_Copy". With
// --benchmark_repetitions the medians are used.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace kvq::bench {

/// \brief Takes --NAME=VALUE out of argv (a bench's own flags, read before the benchmark ones);
/// returns VALUE, or dflt when the flag is absent.
inline std::string take_flag(int& argc, char** argv, const std::string& name,
                             const std::string& dflt) {
  std::string value = dflt;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--" + name + "=", 0) == 0)
      value = a.substr(name.size() + 3);
    else
      argv[out++] = argv[i];
  }
  argc = out;
  return value;
}

/// \brief The run that stands for a case: its median when repeated, the run itself otherwise
/// (errors excluded).
inline bool is_summary(const benchmark::BenchmarkReporter::Run& r) {
  using Run = benchmark::BenchmarkReporter::Run;
  if (r.error_occurred) return false;
  const bool median = r.run_type == Run::RT_Aggregate && r.aggregate_name == "median";
  return median || (r.run_type == Run::RT_Iteration && r.repetitions <= 1);
}

class RatioTable : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (!is_summary(r)) continue;
      const std::string name = r.run_name.function_name;
      if (!r.counters.count("bytes_per_second")) continue;
      bw_[name] = r.counters.at("bytes_per_second");
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    double copy = 0;
    for (const auto& [n, b] : bw_)
      if (n.rfind("BM_Copy", 0) == 0) copy = b;
    std::printf("\n%-48s %8s %8s %8s\n", "case", "GB/s", "of_copy", "cpu/ref");
    for (const auto& [n, b] : bw_) {
      std::string ref = n;
      const auto at = ref.find("/cpu/");
      double vs_ref = 0;
      if (at != std::string::npos) {
        ref.replace(at, 5, "/ref/");
        if (bw_.count(ref)) vs_ref = b / bw_[ref];
      }
      std::printf("%-48s %8.2f %7.0f%% %7.2fx\n", n.c_str(), b / 1e9,
                  copy > 0 ? 100.0 * b / copy : 0.0, vs_ref);
    }
    if (copy > 0) std::printf("memcpy bandwidth: %.2f GB/s\n", copy / 1e9);
  }

 private:
  std::map<std::string, double> bw_;
};

/// \brief The main() of a bench that reports through RatioTable: registers its cases for
/// --backend=ref|cpu|both (default both), then runs them.
template <typename Register>
int ratio_main(int argc, char** argv, Register&& register_all) {
  register_all(take_flag(argc, argv, "backend", "both"));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioTable table;
  benchmark::RunSpecifiedBenchmarks(&table);
  benchmark::Shutdown();
  return 0;
}

}  // namespace kvq::bench
