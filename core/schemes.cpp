// The table of scheme families' traits records (core/schemes.h), one per line of
// schemes/families.def: a family's record is k<Name>Scheme in schemes/<family>/traits.cpp.
#include "core/schemes.h"

#include <array>
#include <vector>

#include "core/error.h"

namespace kvq {

#define KVQ_SCHEME_FAMILY(folder, Name, ...) extern const SchemeTraits k##Name##Scheme;
#include "schemes/families.def"
#undef KVQ_SCHEME_FAMILY

namespace {

const std::array kFamilies{
#define KVQ_SCHEME_FAMILY(folder, Name, ...) &k##Name##Scheme,
#include "schemes/families.def"
#undef KVQ_SCHEME_FAMILY
};

}  // namespace

std::span<const SchemeTraits* const> scheme_families() { return kFamilies; }

const SchemeTraits& scheme_traits(SchemeKind kind) {
  for (const SchemeTraits* t : kFamilies)
    for (const SchemeKindName& k : t->kinds)
      if (k.kind == kind) return *t;
  fail("scheme kind {} has no registered family (schemes/families.def)", static_cast<int>(kind));
}

const SchemeTraits& scheme_traits(const SchemeSpec& s) { return scheme_traits(s.kind()); }

std::string_view kind_label(SchemeKind kind) {
  for (const SchemeKindName& k : scheme_traits(kind).kinds)
    if (k.kind == kind) return k.label;
  return "?";
}

std::span<const SchemeKind> scheme_kinds() {
  static const std::vector<SchemeKind> kinds = [] {
    std::vector<SchemeKind> v;
    for (const SchemeTraits* t : kFamilies)
      for (const SchemeKindName& k : t->kinds) v.push_back(k.kind);
    return v;
  }();
  return kinds;
}

std::string scheme_names() {
  std::string out;
  for (const SchemeTraits* t : kFamilies) out += std::string(t->names) + ", ";
  return out + "k=SPEC;v=SPEC";
}

std::string scheme_help() {
  std::string out = "Schemes (--kv SPEC; NAME[:key=value,...]):\n";
  for (const SchemeTraits* t : kFamilies) {
    out += fmt::format("  {}\n      {}\n      {}\n", t->names, t->keys_help, t->description);
    for (const SchemeAlias& a : t->aliases)
      if (a.rewrite) out += fmt::format("      {}: {}\n", a.name, a.means);
  }
  out +=
      "  every scheme also takes rot=hadamard[:SEED] (stored rotated) and sink=S (the first S "
      "tokens exact)\n"
      "  k=SPEC;v=SPEC: keys and values in different schemes; SPEC@LAYERS=SPEC, "
      "SPEC@first=F,last=L: per-layer schemes (core/spec.h)\n";
  return out;
}

}  // namespace kvq
