// Range checks for the CLI with messages a person can read, and the record of the build and
// the machine (experiments/commands.h).
#include <fmt/format.h>
#include <unistd.h>

#include <csignal>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/io.h"
#include "experiments/commands.h"
#include "evaluation/kv_input.h"

namespace kvq::cli {

CLI::Validator at_least(long long min) {
  return CLI::Validator(
      [min](std::string& s) -> std::string {
        const std::optional<long long> v = whole_number(s);
        if (!v) return fmt::format("must be a whole number, got '{}'", s);
        if (*v < min) return fmt::format("must be at least {}, got {}", min, s);
        return {};
      },
      fmt::format("INT >= {}", min));
}

CLI::Validator above_zero() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !std::isfinite(v))
          return fmt::format("must be a number, got '{}'", s);
        if (!(v > 0)) return fmt::format("must be greater than 0, got {}", s);
        return {};
      },
      "NUMBER > 0");
}

namespace {

// Whether two paths name one file: the same file on disk (links, "./" and ".." included), or the
// same absolute path when it does not exist yet.
bool same_file(std::string_view a, std::string_view b) {
  namespace fs = std::filesystem;
  std::error_code ea, eb;
  const fs::path pa(a), pb(b);
  if (fs::exists(pa, ea) && fs::exists(pb, eb)) return fs::equivalent(pa, pb, ea);
  return fs::weakly_canonical(pa, ea) == fs::weakly_canonical(pb, eb);
}

}  // namespace

void check_outputs(std::initializer_list<std::string_view> inputs,
                   std::initializer_list<OutputFile> outputs) {
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    if (o->path.empty()) continue;
    const std::string_view p = o->path;
    bool named = false;  // ends in one of the extensions ("|" separates them)
    for (std::string_view rest = o->ext; !rest.empty() && !named;) {
      const std::string_view e = rest.substr(0, rest.find('|'));
      named = p.size() > e.size() && p.substr(p.size() - e.size()) == e;
      rest = e.size() < rest.size() ? rest.substr(e.size() + 1) : std::string_view{};
    }
    if (!named) {
      const std::string_view first = o->ext.substr(0, o->ext.find('|'));
      throw Error(fmt::format("{} '{}': the file is written as {}; name it FILE{}", o->what, p,
                              first.substr(1), first));
    }
    for (std::string_view in : inputs)
      if (!in.empty() && same_file(p, kv_input_file(std::string(in))))
        throw Error(fmt::format("{} '{}' is the input '{}': writing it would replace the data "
                                "being read; name another file",
                                o->what, p, in));
    for (auto e = outputs.begin(); e != o; ++e)
      if (!e->path.empty() && same_file(p, e->path))
        throw Error(
            fmt::format("{} and {} both name '{}': give each its own file", e->what, o->what, p));
  }
}

namespace {
volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_sigint(int) {
  g_stop = 1;
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C kills at once
}
}  // namespace

StopOnCtrlC::StopOnCtrlC() {
  g_stop = 0;
  std::signal(SIGINT, on_sigint);
}
StopOnCtrlC::~StopOnCtrlC() { std::signal(SIGINT, SIG_DFL); }

void check_stop() {
  if (g_stop) throw Interrupted("interrupted");
}

namespace {
std::string& version_slot() {
  static std::string v;
  return v;
}
}  // namespace

void set_build_version(std::string v) { version_slot() = std::move(v); }
const std::string& build_version() { return version_slot(); }

std::string machine_name() {
  static const std::string name = [] {  // read once: every result row records it
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
    std::string cpu = "unknown CPU";
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
        cpu = line.substr(line.find(':') + 2);
        break;
      }
    return fmt::format("{}: {} x {}", host[0] ? host : "unknown host", cpu,
                       std::thread::hardware_concurrency());
  }();
  return name;
}

}  // namespace kvq::cli
