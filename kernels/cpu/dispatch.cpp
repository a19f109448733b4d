// Backend `cpu`: which CPU path this process runs, chosen once from cpuid / xgetbv or forced by
// KVQ_CPU_PATH, and the public kernel functions as forwarders through its table
// (kernels/cpu/dispatch.h). Compiled for baseline x86-64 (or the target's baseline elsewhere).
#include "kernels/cpu/dispatch.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

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

// Each path's table getter (kernels/cpu/path.cpp), in the order of width; KVQ_CPU_HAVE_<path>
// for each path this build compiles (KVQ_CPU_PATHS, cmake/cpu_paths.cmake; portable always).
extern "C" const kvq::cpu::Kernels* kvq_cpu_path_portable();
extern "C" const kvq::cpu::Kernels* kvq_cpu_path_avx2();
extern "C" const kvq::cpu::Kernels* kvq_cpu_path_avx512();
extern "C" const kvq::cpu::Kernels* kvq_cpu_path_avx512bf16();

namespace kvq::cpu {
namespace {

/// What this CPU (and its OS, which must save the wider registers) runs.
struct Features {
  bool avx2 = false;        // AVX, AVX2, FMA, F16C, OS-saved ymm
  bool avx512 = false;      // x86-64-v4 (v3 and AVX-512 F/BW/CD/DQ/VL, OS-saved zmm) and VNNI
  bool avx512bf16 = false;  // and VBMI, AVX512-BF16
  bool amx = false;         // AMX-TILE, AMX-BF16 (the OS grants the tiles: amx_granted)
};

Features detect() {
  Features f;
#if KVQ_CPU_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const unsigned c1 = c;
  auto bit = [](unsigned r, int i) { return ((r >> i) & 1u) != 0; };
  // x86-64-v2 and v3's leaf-1 features: SSE3, SSSE3, CX16, SSE4.1, SSE4.2, MOVBE, POPCNT, FMA,
  // XSAVE, OSXSAVE, AVX, F16C
  for (int i : {0, 9, 12, 13, 19, 20, 22, 23, 26, 27, 28, 29})
    if (!bit(c1, i)) return f;
  unsigned xlo, xhi;
  __asm__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  if ((xlo & 0x6) != 0x6) return f;  // the OS saves xmm and ymm
  unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0;
  if (__get_cpuid_count(7, 0, &a, &b7, &c7, &d7) == 0) return f;
  __get_cpuid_count(7, 1, &a71, &b, &c, &d);
  if (!bit(b7, 5)) return f;  // AVX2
  f.avx2 = true;
  unsigned e1c = 0;
  if (__get_cpuid(0x80000001, &a, &b, &e1c, &d) == 0) return f;
  const bool v3 = bit(b7, 3) && bit(b7, 8) && bit(e1c, 5) && bit(e1c, 0);  // BMI1 BMI2 LZCNT LAHF
  const bool zmm = (xlo & 0xe0) == 0xe0;  // opmask, zmm0-15 upper halves, zmm16-31
  // AVX-512 F, DQ, CD, BW, VL; VNNI
  f.avx512 = v3 && zmm && bit(b7, 16) && bit(b7, 17) && bit(b7, 28) && bit(b7, 30) && bit(b7, 31) &&
             bit(c7, 11);
  f.avx512bf16 = f.avx512 && bit(c7, 1) && bit(a71, 5);  // VBMI, AVX512-BF16
  f.amx = f.avx512bf16 && bit(d7, 24) && bit(d7, 22) &&  // AMX-TILE, AMX-BF16
          (xlo & 0x60000) == 0x60000;                    // XTILECFG, XTILEDATA
#endif
  return f;
}

const Features& features() {
  static const Features f = detect();
  return f;
}

struct Entry {
  const Kernels* (*table)();
  bool (*runs)(const Features&);
};
constexpr Entry kPaths[] = {
    {kvq_cpu_path_portable, [](const Features&) { return true; }},
#if KVQ_CPU_X86 && defined(KVQ_CPU_HAVE_avx2)
    {kvq_cpu_path_avx2, [](const Features& f) { return f.avx2; }},
#endif
#if KVQ_CPU_X86 && defined(KVQ_CPU_HAVE_avx512)
    {kvq_cpu_path_avx512, [](const Features& f) { return f.avx512; }},
#endif
#if KVQ_CPU_X86 && defined(KVQ_CPU_HAVE_avx512bf16)
    {kvq_cpu_path_avx512bf16, [](const Features& f) { return f.avx512bf16; }},
#endif
};

std::string names(bool only_supported) {
  std::string s;
  for (const Entry& e : kPaths)
    if (!only_supported || e.runs(features()))
      s += (s.empty() ? "" : ", ") + std::string(e.table()->info.name);
  return s;
}

const Kernels& choose() {
  const char* env = std::getenv("KVQ_CPU_PATH");
  if (env == nullptr || *env == '\0') {
    const Kernels* best = nullptr;
    for (const Entry& e : kPaths)
      if (e.runs(features())) best = e.table();
    return *best;
  }
  for (const Entry& e : kPaths)
    if (std::string_view(env) == e.table()->info.name) {
      KVQ_CHECK(e.runs(features()),
                "KVQ_CPU_PATH={}: this CPU lacks that path's instructions; it runs {}", env,
                names(true));
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
      path().amx && features().amx &&
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
