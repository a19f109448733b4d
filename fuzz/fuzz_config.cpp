// `kvq run --dry-run` on an arbitrary TOML config, through kvq's own config reader (the CLI's
// run command, in process): a config is either listed or rejected with one kvq::Error line or a
// CLI11 parse error; --dry-run writes nothing.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <string>

#include "experiments/commands.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvq;
  static const std::string path = "/tmp/kvq-fuzz-config-" + std::to_string(getpid()) + ".toml";
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data),
                                              static_cast<std::streamsize>(size));
  CLI::App app{"kvq"};
  app.require_subcommand(1);
  cli::register_run(app);
  std::vector<std::string> args{path, "--dry-run", "run"};  // CLI11 takes the vector reversed
  fuzz::accept_errors([&] {
    try {
      app.parse(args);
    } catch (const CLI::ParseError&) {
    }
  });
  return 0;
}
