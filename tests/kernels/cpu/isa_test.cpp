// Tests for kernels/cpu/isa.h's SIMD helpers (the byte dot products), built once per CPU path with
// that path's flags (tests/kernels/cpu/CMakeLists.txt, beside simd_decode_test.cpp): the helpers
// each path's kernels inline. Expected values: the definition, acc + the sum of four u8 x s8
// products per 32-bit lane, in int64. On a CPU that lacks the path every test skips (PathGuard).
#include "kernels/cpu/isa.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <sstream>
#include <string>

#define KVQ_CPU_TEST_STR2(x) #x
#define KVQ_CPU_TEST_STR(x) KVQ_CPU_TEST_STR2(x)

namespace kvq::cpu {
namespace {

// Skips every test of this program where the CPU does not run the path it was compiled for.
class PathGuard : public ::testing::Environment {
 public:
  void SetUp() override {
    const std::string want = KVQ_CPU_TEST_STR(KVQ_CPU_PATH_NS);
    std::stringstream runs(supported_paths());
    for (std::string p; std::getline(runs >> std::ws, p, ',');)
      if (p == want) return;
    GTEST_SKIP() << "this CPU lacks path " << want << " (it runs " << supported_paths() << ")";
  }
};
[[maybe_unused]] ::testing::Environment* const kGuard =
    ::testing::AddGlobalTestEnvironment(new PathGuard);

#if KVQ_CPU_AVX2
// The byte dot product's two forms (kernels/cpu/isa.h): vpdpbusd where compiled in, else
// vpmaddubsw + vpmaddwd, against the definition acc + sum of four u8 * s8 products per lane, on
// the operands the int8 mode gives them (unsigned up to 255 against signed codes up to 15, unsigned
// codes up to 15 against int8 queries -127..127), extremes included. On paths with VNNI dpbusd is
// vpdpbusd; dpbusd_avx2 is the avx2 path's.
TEST(cpuDpbusd, bothForms_equalTheDefinition) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20000; ++trial) {
    const bool values = trial % 2 == 0;
    alignas(32) uint8_t u[32];
    alignas(32) int8_t s8[32];
    alignas(32) int32_t acc[8], got[8], emu[8];
    for (int i = 0; i < 32; ++i) {
      const int ext = trial < 4;  // the first trials: every operand at its extreme
      u[i] = static_cast<uint8_t>(values ? (ext ? 255 : rng() % 256) : (ext ? 15 : rng() % 16));
      s8[i] = static_cast<int8_t>(
          values ? (ext ? 15 : static_cast<int>(rng() % 16))
                 : (ext ? (trial % 4 == 1 ? -127 : 127) : static_cast<int>(rng() % 255) - 127));
    }
    for (int l = 0; l < 8; ++l) acc[l] = static_cast<int32_t>(rng() % 2000001) - 1000000;
    const __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(acc));
    const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(u));
    const __m256i y = _mm256_load_si256(reinterpret_cast<const __m256i*>(s8));
    _mm256_store_si256(reinterpret_cast<__m256i*>(got), dpbusd(a, x, y));
    _mm256_store_si256(reinterpret_cast<__m256i*>(emu), dpbusd_avx2(a, x, y));
    for (int l = 0; l < 8; ++l) {
      int32_t want = acc[l];
      for (int b = 0; b < 4; ++b) want += u[4 * l + b] * s8[4 * l + b];
      ASSERT_EQ(got[l], want) << "dpbusd, trial " << trial << " lane " << l;
      ASSERT_EQ(emu[l], want) << "dpbusd_avx2, trial " << trial << " lane " << l;
    }
  }
}
#endif

#if KVQ_CPU_AVX512 && defined(__AVX512VNNI__)
// isa.h's dpbusd512 (vpdpbusd in an asm statement, the accumulator its destination) against the
// definition: acc + the four products u8 x s8 of each 32-bit lane, over full-range bytes, chained
// three deep as the kernels carry their accumulators.
TEST(cpuDpbusd, inPlace512_equalsTheDefinition) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 5000; ++trial) {
    alignas(64) uint8_t u[3][64];
    alignas(64) int8_t s8[3][64];
    alignas(64) int32_t acc[16], got[16];
    for (int k = 0; k < 3; ++k)
      for (int i = 0; i < 64; ++i) {
        const bool ext = trial < 2;  // every operand at its extreme
        u[k][i] = static_cast<uint8_t>(ext ? 255 : rng() % 256);
        s8[k][i] = static_cast<int8_t>(ext ? (trial == 0 ? -128 : 127)
                                           : static_cast<int>(rng() % 256) - 128);
      }
    for (int l = 0; l < 16; ++l) acc[l] = static_cast<int32_t>(rng() % 2000001) - 1000000;
    __m512i a = _mm512_load_si512(acc);
    for (int k = 0; k < 3; ++k) a = dpbusd512(a, _mm512_load_si512(u[k]), _mm512_load_si512(s8[k]));
    _mm512_store_si512(got, a);
    for (int l = 0; l < 16; ++l) {
      int64_t want = acc[l];
      for (int k = 0; k < 3; ++k)
        for (int b = 0; b < 4; ++b) want += u[k][4 * l + b] * s8[k][4 * l + b];
      ASSERT_EQ(got[l], want) << "trial " << trial << " lane " << l;
    }
  }
}
#endif

// ctest runs this program with KVQ_CPU_PATH set to its path (tests/kernels/cpu/CMakeLists.txt): the
// table the process then runs (kernels/cpu/path.cpp, compiled in the path's kernel build) must
// report what this program's macros say, compiled with the same flags (kvq_cpu_path_flags).
TEST(cpuPathTable, theForcedPathReportsItsBuildsInstructions) {
  const std::string want = KVQ_CPU_TEST_STR(KVQ_CPU_PATH_NS);
  if (want != path().name) GTEST_SKIP() << "run with KVQ_CPU_PATH=" << want << " (ctest does)";
  EXPECT_EQ(path().avx2, KVQ_CPU_AVX2 != 0);
  EXPECT_EQ(path().vnni, KVQ_CPU_VNNI != 0);
  EXPECT_EQ(path().avx512, KVQ_CPU_AVX512 != 0);
  EXPECT_EQ(path().bf16dot, KVQ_CPU_BF16DOT != 0);
  EXPECT_EQ(path().amx, KVQ_CPU_AMX != 0);
}

}  // namespace
}  // namespace kvq::cpu
