// The scheme kinds and the two roles of a cache side: the vocabulary every scheme's file
// (core/schemes/<family>.h) and every backend share. One line per kind; its family's traits record
// (core/schemes.h) says how it is parsed, named, measured and stored.
#pragma once

namespace kvq {

/// \brief Which half of the KV cache a tensor is; schemes may treat keys and values apart.
enum class Role { Key, Value };

/// \brief The storage kinds a side can have (StoredSide::kind, SchemeSpec::kind()): the float
/// family's three, fp8 (three formats), int (int<B> / kivi<B>).
enum class SchemeKind { Fp32, Bf16, Fp16, Fp8, Int };

}  // namespace kvq
