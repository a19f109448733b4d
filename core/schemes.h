// The scheme registry (issue 48, item 1): one traits record per scheme family, in the manner of
// ggml's type_traits. A family's folder, schemes/<family>/ (params.h, traits.cpp), holds its
// parameters (FloatSpec, Fp8Spec, IntSpec), its names and aliases, the parse of its own keys with
// their defaults and errors, its canonical name, its footprint (bytes of a side for a shape, from a
// spec and from a stored view) and the round-trip error bound its tests hold it to; the one table,
// core/schemes.cpp, lists the records of schemes/families.def. parse_spec,
// SchemeSpec::canonical, footprint, the scheme list of `kvq quant --help` / Python's
// kvq.schemes() and the registry tests iterate it. What is not a family's own (k=SPEC;v=SPEC,
// SPEC@LAYERS, rot=, sink=) stays in core/spec.cpp.
//
// How a side of the family is stored and read back is one table each beside its code (ggml's
// type_traits_cpu): cache/schemes.cpp (make_side, round_trip: the storage every backend shares),
// reference_cpu/reads.cpp (the reference's reads); which backends read a kind is
// kernels/backend.h's BackendSupport::kinds.
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/error.h"
#include "core/footprint.h"
#include "core/spec.h"
#include "core/stored_side.h"

namespace kvq {

/// \brief One key a family takes after NAME: (`flag`: written alone, as `sym`).
struct SchemeKey {
  std::string_view name;
  bool flag = false;
  /// Its default as written after '=' (NAME and NAME:key=value parse alike); none for a flag
  /// (off unless written).
  std::string_view value = {};
};

/// \brief One parameter of a parsed one-side spec, as Python's kvq.parse_spec names it ("kind",
/// "bits", "gran", ...; rot= and sink= are every scheme's, spec.cpp's).
struct SchemeField {
  std::string_view name;
  std::variant<bool, int64_t, double, std::string> value;
};

/// \brief Where a side's quantization scales come from, as report rows say it.
struct ScaleOrigin {
  std::string text;     ///< "-", "each token", "each 32 tokens", "tokens 0-15 of 64", "fixed 0.25"
  bool prefix = false;  ///< from a prefix of the tokens that leaves later quantized tokens out
};

/// \brief Where a growing side's footprint drops (it peaks just before): a KIVI per-channel side
/// quantizes its exact window each time a block completes, an FP8 side with dynamic first=N scales
/// its exact tokens once the N-th arrives. Between drops the footprint only grows.
struct FootprintDrops {
  int64_t period = 0;  ///< > 0: at every token count t with t - after + 1 a positive multiple of it
  int64_t after = 0;   ///< the tokens in front of the periodic part (sink=S: its S exact sinks)
  int64_t at = -1;     ///< >= 0: at this token count (sinks included), once
};

/// \brief Another name for a family's scheme. Without `rewrite` it is a plain alias of the name
/// `means` (fp8 = fp8_e4m3); with it, the whole spec (its keys too) becomes the spec it returns
/// (hf[:nbits=...] = int<B>:k=token,v=token,...), parsed again.
struct SchemeAlias {
  std::string_view name;
  std::string_view means;  ///< the name (plain), or what it stands for (--help)
  std::string (*rewrite)(std::string_view text, std::string_view params) = nullptr;
};

/// \brief One SchemeKind of a family, as backend tables and errors name it.
struct SchemeKindName {
  SchemeKind kind;
  std::string_view label;  ///< "fp32", "bf16", "fp16", "fp8", "int/kivi"
};

/// \brief Everything core knows of one scheme family. Errors are kvq::Error lines
/// "bad scheme spec 'TEXT': ..." naming the bad part and what is allowed.
struct SchemeTraits {
  std::string_view family;  ///< "float", "fp8", "int": schemes/<family>/traits.cpp
  std::span<const SchemeKindName> kinds;
  std::string_view names;      ///< the names it parses ("fp32, bf16, fp16"), for errors and --help
  std::string_view keys_help;  ///< its keys and their defaults, for --help
  std::string_view description;  ///< one line for --help
  std::span<const SchemeAlias> aliases;
  /// Canonical specs the registry tests sweep (every key and flag of the family at least once).
  std::span<const std::string_view> examples;

  /// \brief Whether a scheme name (what precedes ':') is this family's.
  bool (*claims)(std::string_view name);
  /// \brief The defaults of `name` (one it claims); throws for a malformed one (int5, fp8_e3m4).
  SchemeParams (*make)(std::string_view text, std::string_view name);
  /// \brief The keys `s` (made by `make`) takes; rot= and sink= are every scheme's (spec.cpp).
  std::span<const SchemeKey> (*keys)(const SchemeSpec& s);
  /// \brief Applies one key (one `keys` names, given once; `val` non-empty unless a flag).
  void (*set)(SchemeSpec& s, std::string_view text, std::string_view key, std::string_view val);
  /// \brief Checks the keys together once all are set (`seen`: the keys written, rot/sink too).
  void (*check)(const SchemeSpec& s, std::string_view text, std::string_view name,
                const std::set<std::string>& seen);
  /// \brief The canonical spelling of `s` without rot= / sink= (a result key: never change one).
  std::string (*canonical)(const SchemeSpec& s);
  /// \brief Bytes one side of `s` (no sinks, no per-layer, no split) stores for `shape`.
  Footprint (*footprint)(const SchemeSpec& s, Role role, Shape3 shape);
  /// \brief Bytes a stored view of the family holds for its tokens after the sinks (`shape`).
  Footprint (*stored_footprint)(const StoredSide& side, Shape3 shape);
  /// \brief Of `tokens` tokens (after the sinks), how many one side of `s` holds as the family's
  /// codes rather than exact: fp32 none (the exact cache), bf16 / fp16 all, fp8 none until a
  /// `streamed` side's first-N scales freeze, int the window rule (quantized_tokens).
  int64_t (*coded_tokens)(const SchemeSpec& s, Role role, int64_t tokens, bool streamed);
  /// \brief The largest |x - x'| a round trip of a tensor with max |x| = amax may leave, by the
  /// family's definition (dynamic scales; fp8 constant and calib scales may saturate: infinity).
  double (*max_error)(const SchemeSpec& s, double amax);
  /// \brief The parameters of `s` by name, its "kind" first (Python's kvq.parse_spec fields).
  std::vector<SchemeField> (*fields)(const SchemeSpec& s);
  /// \brief Where the scales of a `role` side of `s` holding `tokens` tokens come from.
  ScaleOrigin (*scale_origin)(const SchemeSpec& s, Role role, int64_t tokens);
  /// \brief Where a growing `role` side of `s` (head_dim `dim`) drops its footprint.
  FootprintDrops (*footprint_drops)(const SchemeSpec& s, Role role, int64_t dim);
};

/// \brief The registered families, in the order --help and errors list them.
std::span<const SchemeTraits* const> scheme_families();
/// \brief The family of a kind / of a one-side spec.
const SchemeTraits& scheme_traits(SchemeKind kind);
const SchemeTraits& scheme_traits(const SchemeSpec& s);
/// \brief The record of `kind`'s family in a backend's per-family table (records with a
/// `family` field, e.g. cache/schemes.cpp's); `where` names the table for the error when
/// the family registered here has no record there.
template <class Record>
const Record& family_record(std::span<const Record* const> table, SchemeKind kind,
                            std::string_view where) {
  const std::string_view family = scheme_traits(kind).family;
  for (const Record* r : table)
    if (r->family == family) return *r;
  fail("scheme family '{}' has no record in {}", family, where);
}
/// \brief "fp32", ..., "fp8", "int/kivi": a kind as backend tables name it.
std::string_view kind_label(SchemeKind kind);
/// \brief Every kind of every family, in registry order.
std::span<const SchemeKind> scheme_kinds();
/// \brief "fp32, bf16, fp16, fp8_e4m3 (alias fp8), ..., k=SPEC;v=SPEC": the names parse_spec
/// takes, for its errors.
std::string scheme_names();
/// \brief The scheme list of --help: per family its names, keys and one line, then the forms
/// every scheme takes (rot=, sink=, k=;v=, @LAYERS).
std::string scheme_help();

/// Helpers for the families' parsers (core/spec.cpp's, shared).
namespace scheme_parse {
/// \brief `v` as an int, or "bad scheme spec 'TEXT': KEY=V is not an integer".
int integer(std::string_view text, std::string_view v, std::string_view key);
/// \brief `s` cut at every `sep` (empty pieces kept).
std::vector<std::string_view> split(std::string_view s, char sep);
}  // namespace scheme_parse

}  // namespace kvq
