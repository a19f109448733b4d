// kvq: low-bit KV-cache quantization experiments. Every error ends as one line on stderr and a
// nonzero exit status (1: bad input or configuration, 2: bad command line).
#include <csignal>
#include <cstdio>
#include <exception>
#include <string>

#include "core/error.h"
#include "experiments/commands.h"
#include "experiments/version.h"

namespace {

// "kvq model ppl": the deepest command the command line reached, for the help a usage error
// points to.
std::string command_of(const CLI::App& app) {
  std::string s = "kvq";
  const CLI::App* a = &app;
  for (auto subs = a->get_subcommands(); !subs.empty(); subs = a->get_subcommands()) {
    a = subs.front();
    s += " " + a->get_name();
  }
  return s;
}

// A word where a command is expected that names none ("kvq nosuchcmd", "kvq model nosuch"): the
// one-line error that names it and the commands there are; empty when every word is known.
std::string unknown_command(const CLI::App& app, int argc, char** argv) {
  const CLI::App* at = &app;
  std::string path = "kvq";
  for (int i = 1; i < argc; ++i) {
    const std::string w = argv[i];
    const auto subs = at->get_subcommands([](const CLI::App*) { return true; });
    if (w.empty() || w[0] == '-' || subs.empty()) break;
    const CLI::App* next = nullptr;
    std::string names;
    for (const CLI::App* s : subs) {
      if (s->check_name(w)) next = s;
      names += (names.empty() ? "" : ", ") + s->get_name();
    }
    if (!next)
      return "kvq: unknown command '" + path + " " + w + "' (commands: " + names + "; see '" +
             path + " --help')";
    at = next;
    path += " " + next->get_name();
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "kvq: low-bit KV-cache quantization (KIVI 2-8 bit, FP8) - quantize, compare and plan.\n"
      "Schemes are named by spec strings such as fp8_e4m3:gran=head or kivi2:g=32,r=128.\n"
      "Run 'kvq <command> --help' for each command's options and examples.",
      "kvq"};
  app.set_version_flag(
      "--version", [] { return kvq::version_text(); },
      "print the version, the commit built and backend cpu's CPU paths");
  app.require_subcommand(1);
  // A file-size limit (ulimit -f) or a full disk makes a write fail with an error naming the file
  // (core/io.cpp) instead of killing kvq with SIGXFSZ; the finished rows stay as they were.
  std::signal(SIGXFSZ, SIG_IGN);
  kvq::cli::set_build_version(kvq::version_string());
  kvq::cli::register_plan(app);
  kvq::cli::register_quant(app);
  kvq::cli::register_compare(app);
  kvq::cli::register_synth(app);
  kvq::cli::register_model(app);
  kvq::cli::register_run(app);
  kvq::cli::register_stats(app);
  kvq::cli::register_advise(app);
  if (const std::string e = unknown_command(app, argc, argv); !e.empty()) {
    std::fprintf(stderr, "%s\n", e.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "kvq: %s (see '%s --help')\n", e.what(), command_of(app).c_str());
    return 2;
  } catch (const kvq::cli::Interrupted& e) {
    std::fprintf(stderr, "kvq: %s\n", e.what());
    return 130;  // as a shell reports a command stopped by SIGINT
  } catch (const kvq::Error& e) {
    std::fprintf(stderr, "kvq: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "kvq: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvq: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
