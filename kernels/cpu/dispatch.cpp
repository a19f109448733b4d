// Backend `cpu`: which CPU path this process runs, chosen once from cpuid / xgetbv or forced by
// KVQ_CPU_PATH, and the public kernel functions as forwarders through its table
// (kernels/cpu/dispatch.h). Compiled for baseline x86-64 (or the target's baseline elsewhere).
#include "kernels/cpu/dispatch.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

#if defined(__x86_64__)
#define KVQ_CPU_X86 1
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#else
#define KVQ_CPU_X86 0
#endif

// Each built path's table getter (kernels/cpu/path.cpp): KVQ_CPU_BUILT lists the paths this build
// compiles (KVQ_CPU_PATHS, cmake/cpu_paths.cmake), in kernels/cpu/paths.def's order, widest last.
#ifndef KVQ_CPU_BUILT
#define KVQ_CPU_BUILT KVQ_CPU_BUILT_PATH(portable)
#endif
#define KVQ_CPU_BUILT_PATH(name) extern "C" const kvq::cpu::Kernels* kvq_cpu_path_##name();
KVQ_CPU_BUILT
#undef KVQ_CPU_BUILT_PATH

namespace kvq::cpu {
namespace {

enum Reg { eax, ebx, ecx, edx };

/// A CPU feature as kernels/cpu/paths.def declares it.
struct Feature {
  std::string_view name;
  unsigned leaf, subleaf;
  Reg reg;
  int bit;
  unsigned xcr0;  // the register state the OS must save for it
};
constexpr Feature kFeatures[] = {
#define KVQ_CPU_FEATURE(name, macro, leaf, subleaf, reg, bit, xcr0) \
  {#name, leaf, subleaf, reg, bit, xcr0},
#include "kernels/cpu/paths.def"
};

/// Whether this CPU has feature f and its OS saves the state f needs (cpuid, xgetbv).
bool has(const Feature& f) {
#if KVQ_CPU_X86
  unsigned r[4] = {};
  if (__get_cpuid_count(f.leaf, f.subleaf, &r[0], &r[1], &r[2], &r[3]) == 0) return false;
  if (((r[f.reg] >> f.bit) & 1u) == 0) return false;
  if (f.xcr0 == 0) return true;
  unsigned a, b, c, d;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0 || ((c >> 27) & 1u) == 0) return false;  // OSXSAVE
  unsigned xlo, xhi;
  __asm__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  return (xlo & f.xcr0) == f.xcr0;
#else
  (void)f;
  return false;
#endif
}

/// Whether this CPU has every feature of a space-separated list of paths.def's names.
bool has_all(std::string_view names) {
  static const std::vector<bool> present = [] {
    std::vector<bool> v;
    for (const Feature& f : kFeatures) v.push_back(has(f));
    return v;
  }();
  size_t i = 0;
  while (i < names.size()) {
    const size_t j = std::min(names.find(' ', i), names.size());
    const std::string_view n = names.substr(i, j - i);
    i = j + 1;
    if (n.empty()) continue;
    bool found = false;
    for (size_t k = 0; k < std::size(kFeatures); ++k)
      if (kFeatures[k].name == n) {
        if (!present[k]) return false;
        found = true;
      }
    if (!found) return false;  // (cmake/cpu_paths.cmake refuses such a paths.def)
  }
  return true;
}

/// A path as paths.def declares it: the features it needs to run and those it uses where present.
struct PathDef {
  std::string_view name, needs, uses;
};
constexpr PathDef kDefs[] = {
#define KVQ_CPU_PATH(name, flags, needs, uses) {#name, needs, uses},
#include "kernels/cpu/paths.def"
};

const PathDef& def_of(std::string_view name) {
  for (const PathDef& d : kDefs)
    if (d.name == name) return d;
  fail("kvq: CPU path {} has no line in kernels/cpu/paths.def", name);
}

struct Entry {
  const Kernels* (*table)();
  bool runs() const { return has_all(def_of(table()->info.name).needs); }
};
constexpr Entry kPaths[] = {
#define KVQ_CPU_BUILT_PATH(name) {kvq_cpu_path_##name},
    KVQ_CPU_BUILT
#undef KVQ_CPU_BUILT_PATH
};

std::string names(bool only_supported) {
  std::string s;
  for (const Entry& e : kPaths)
    if (!only_supported || e.runs())
      s += (s.empty() ? "" : ", ") + std::string(e.table()->info.name);
  return s;
}

const Kernels& choose() {
  const char* env = std::getenv("KVQ_CPU_PATH");
  if (env == nullptr || *env == '\0') {
    const Kernels* best = nullptr;
    for (const Entry& e : kPaths)
      if (e.runs()) best = e.table();
    return *best;
  }
  for (const Entry& e : kPaths)
    if (std::string_view(env) == e.table()->info.name) {
      KVQ_CHECK(e.runs(), "KVQ_CPU_PATH={}: this CPU lacks that path's instructions; it runs {}",
                env, names(true));
      return *e.table();
    }
  fail("KVQ_CPU_PATH={} is not a CPU path of this build; set it to one of {} (this CPU runs {})",
       env, names(false), names(true));
}

bool& amx_switch() {
  static bool on = [] {
    const char* e = std::getenv("KVQ_AMX");  // KVQ_AMX=0: vdpbf16ps instead (A/B runs)
    return amx_granted() && !(e != nullptr && std::strcmp(e, "0") == 0);
  }();
  return on;
}

}  // namespace

const Kernels& kernels() {
  static const Kernels& k = choose();
  return k;
}

const PathInfo& path() { return kernels().info; }

std::string compiled_paths() { return names(false); }
std::string supported_paths() { return names(true); }

bool amx_granted() {
#if KVQ_CPU_X86 && defined(__linux__)
  static const bool granted =
      path().amx && has_all(def_of(path().name).uses) &&
      syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
  return granted;
#else
  return false;
#endif
}

bool amx() { return amx_switch(); }
void set_amx(bool on) { amx_switch() = on && amx_granted(); }

const char* isa() {
  static const std::string base = [] {
    const PathInfo& p = path();
    if (!p.avx2) return std::string("portable");
    return std::string("avx2+fma+f16c") + (p.vnni ? "+vnni" : "") + (p.avx512 ? "+avx512" : "");
  }();
  static const std::string with_amx = base + "+amx";
  return (amx() ? with_amx : base).c_str();
}

#define KVQ_CPU_FORWARD(member, function, ret, params, args) \
  ret function params { return kernels().member args; }
KVQ_CPU_KERNELS(KVQ_CPU_FORWARD)
#undef KVQ_CPU_FORWARD

}  // namespace kvq::cpu
