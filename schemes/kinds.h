// The scheme kinds and the two roles of a cache side: the vocabulary every scheme family
// (schemes/<family>/) and every backend share. The kinds are those the families' lines in
// schemes/families.def name, in order; a kind's family's traits record (core/schemes.h) says how
// it is parsed, named, measured and stored.
#pragma once

namespace kvq {

/// \brief Which half of the KV cache a tensor is; schemes may treat keys and values apart.
enum class Role { Key, Value };

/// \brief The storage kinds a side can have (StoredSide::kind, SchemeSpec::kind()): the float
/// family's three (Fp32, Bf16, Fp16), Fp8 (three formats), Int (int<B> / kivi<B>).
enum class SchemeKind {
#define KVQ_SCHEME_FAMILY(folder, Name, ...) __VA_ARGS__,
#include "schemes/families.def"
#undef KVQ_SCHEME_FAMILY
};

}  // namespace kvq
