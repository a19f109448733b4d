// The one table of the reference's scheme storage (reference_cpu/schemes.h), one line per family
// of core/schemes.cpp.
#include "reference_cpu/schemes.h"

#include <array>

#include "core/error.h"
#include "core/schemes.h"

namespace kvq {

extern const SchemeStorage kFloatStorage;  // reference_cpu/schemes/float.cpp
extern const SchemeStorage kFp8Storage;    // reference_cpu/schemes/fp8.cpp
extern const SchemeStorage kIntStorage;    // reference_cpu/schemes/int.cpp

namespace {

const std::array<const SchemeStorage*, 3> kStorage{&kFloatStorage, &kFp8Storage, &kIntStorage};

}  // namespace

const SchemeStorage& scheme_storage(SchemeKind kind) {
  const std::string_view family = scheme_traits(kind).family;
  for (const SchemeStorage* s : kStorage)
    if (s->family == family) return *s;
  fail("scheme family '{}' has no reference storage (reference_cpu/schemes.cpp)", family);
}

}  // namespace kvq
