// The one table of the schemes' cache storage (cache/schemes.h), one per line of
// schemes/families.def: a family's record is k<Name>Storage in schemes/<family>/storage.cpp.
#include "cache/schemes.h"

#include <array>

#include "core/schemes.h"

namespace kvq {

#define KVQ_SCHEME_FAMILY(folder, Name, ...) extern const SchemeStorage k##Name##Storage;
#include "schemes/families.def"
#undef KVQ_SCHEME_FAMILY

namespace {

const std::array kStorage{
#define KVQ_SCHEME_FAMILY(folder, Name, ...) &k##Name##Storage,
#include "schemes/families.def"
#undef KVQ_SCHEME_FAMILY
};

}  // namespace

const SchemeStorage& scheme_storage(SchemeKind kind) {
  return family_record<SchemeStorage>(kStorage, kind, "the cache storage (cache/schemes.cpp)");
}

}  // namespace kvq
