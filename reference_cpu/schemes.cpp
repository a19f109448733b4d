// The one table of the reference's scheme storage (reference_cpu/schemes.h), one line per family
// of core/schemes.cpp.
#include "reference_cpu/schemes.h"

#include <array>

#include "core/schemes.h"

namespace kvq {

extern const SchemeStorage kFloatStorage;  // reference_cpu/schemes/float.cpp
extern const SchemeStorage kFp8Storage;    // reference_cpu/schemes/fp8.cpp
extern const SchemeStorage kIntStorage;    // reference_cpu/schemes/int.cpp

namespace {

const std::array<const SchemeStorage*, 3> kStorage{&kFloatStorage, &kFp8Storage, &kIntStorage};

}  // namespace

const SchemeStorage& scheme_storage(SchemeKind kind) {
  return family_record<SchemeStorage>(kStorage, kind,
                                      "the reference's storage (reference_cpu/schemes.cpp)");
}

}  // namespace kvq
