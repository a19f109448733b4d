// Backend `cpu`: one CPU path's table (kernels/cpu/dispatch.h), compiled with that path's flags
// beside its kernels (cmake/cpu_paths.cmake defines KVQ_CPU_PATH_NS, the path's name). The
// table's getter, kvq_cpu_path_<name>, is the one global symbol the path's objects keep: every
// other symbol they define, the inline functions and templates they instantiate with this path's
// instructions included, is made local to them, so no other code can bind to it.
#include "kernels/cpu/dispatch.h"

#define KVQ_CPU_STR2(x) #x
#define KVQ_CPU_STR(x) KVQ_CPU_STR2(x)
#define KVQ_CPU_CAT2(a, b) a##b
#define KVQ_CPU_CAT(a, b) KVQ_CPU_CAT2(a, b)

namespace kvq::cpu::KVQ_CPU_PATH_NS {

#define KVQ_CPU_DECLARE(member, function, ret, params, args) ret function params;
KVQ_CPU_KERNELS(KVQ_CPU_DECLARE)
#undef KVQ_CPU_DECLARE

namespace {
#define KVQ_CPU_ADDRESS(member, function, ret, params, args) &function,
constexpr Kernels kTable{{KVQ_CPU_STR(KVQ_CPU_PATH_NS), KVQ_CPU_AVX2 != 0, KVQ_CPU_VNNI != 0,
                          KVQ_CPU_AVX512 != 0, KVQ_CPU_BF16DOT != 0, KVQ_CPU_AMX != 0},
                         KVQ_CPU_KERNELS(KVQ_CPU_ADDRESS)};
#undef KVQ_CPU_ADDRESS
}  // namespace

}  // namespace kvq::cpu::KVQ_CPU_PATH_NS

extern "C" const kvq::cpu::Kernels* KVQ_CPU_CAT(kvq_cpu_path_, KVQ_CPU_PATH_NS)() {
  return &kvq::cpu::KVQ_CPU_PATH_NS::kTable;
}
