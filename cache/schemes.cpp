// The one table of the schemes' cache storage (cache/schemes.h), one line per family of
// core/schemes.cpp.
#include "cache/schemes.h"

#include <array>

#include "core/schemes.h"

namespace kvq {

extern const SchemeStorage kFloatStorage;  // cache/schemes/float.cpp
extern const SchemeStorage kFp8Storage;    // cache/schemes/fp8.cpp
extern const SchemeStorage kIntStorage;    // cache/schemes/int.cpp

namespace {

const std::array<const SchemeStorage*, 3> kStorage{&kFloatStorage, &kFp8Storage, &kIntStorage};

}  // namespace

const SchemeStorage& scheme_storage(SchemeKind kind) {
  return family_record<SchemeStorage>(kStorage, kind, "the cache storage (cache/schemes.cpp)");
}

}  // namespace kvq
