// Scheme specs: the one way a KV-cache scheme is named everywhere (CLI, configs, result rows,
// plot legends). Grammar: NAME[:key=value[,key=value...]] (flags such as `sym` take no value).
//
//   fp32 | bf16 | fp16
//   fp8_e4m3 | fp8_e4m3fnuz | fp8_e5m2   [gran=tensor|head|token|channel]
//   [scale=dynamic|<num>|calib:<file>]
//                                        [first=N]  (dynamic tensor/head/channel scales: from the
//                                        first N tokens)
//   int<B>  k=channel|token, v=channel|token  [g=G] [r=R] [sym]      B in {2,3,4,8}; g=32, r=0
//   kivi<B> [g=G] [r=R] [sym]   == int<B>:k=channel,v=token with g=32, r=128
//   int<B> / kivi<B> also take arith=exact|fp16: fp16 is KIVI's own reference arithmetic
//                              (kivi/minmax.h minmax_params_fp16), asymmetric only
//   k=SPEC;v=SPEC              keys in one scheme, values in another (llama.cpp's -ctk/-ctv);
//                              also k=SPEC,v=SPEC (the value side starts at the first ",v=" that
//                              names a scheme)
//   every scheme also takes
//     rot=hadamard[:SEED]      store R x instead of x, R the block-diagonal Walsh-Hadamard rotation
//                              of core/rotation.h (random signs from SEED; none without one): the
//                              query is rotated alike, so scores and outputs are unchanged in exact
//                              arithmetic while the quantizer sees outlier channels spread out
//     sink=S                   the first S tokens of the sequence stored exact (attention sinks,
//                              KVQuant / IntactKV); the quantizer starts at token S. A split spec
//                              gives both sides the same S
//   SPEC@LAYERS=SPEC[@LAYERS=SPEC...]
//                              per-layer schemes for a model's cache: LAYERS is a comma list of
//                              layer indices and ranges (0-1,29); the other layers take the first
//                              SPEC. e.g. kivi2@0-1,29=kivi4, fp32@3=kivi2 (one layer quantized).
//                              A one-tensor command (quant, compare, synthetic rows) uses the
//                              scheme of its --layer (0 unless given); a calib path cannot hold '@'
//   SPEC@first=F[,last=L]      layer preset (the peers' keep-the-edges rule: vLLM TurboQuant keeps
//   SPEC@last=L                2 first and 2 last layers unquantized, SGLang's int4 cache layer 0):
//                              the first F and last L layers of the model keep the exact fp32 cache
//                              (kvq's reference cache, so those layers add no error at all);
//                              explicit @LAYERS=SPEC overrides still win. last= resolves against
//                              the model's layer count (resolve_layers); e.g. kivi2@first=2,last=2
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "schemes/kinds.h"  // before the families' params.h, which use SchemeKind
#define KVQ_SCHEME_PARAMS_HEADERS
#include "schemes/families.def"  // each family's schemes/<family>/params.h
#undef KVQ_SCHEME_PARAMS_HEADERS

namespace kvq {

namespace detail {
template <class First, class... Rest>
struct VariantOfRest {
  using type = std::variant<Rest...>;
};
}  // namespace detail

/// \brief One scheme's own parameters: which family (schemes/<family>/params.h) and its keys, one
/// alternative <Name>Spec per line of schemes/families.def, in its order (the first, FloatSpec,
/// is the default: fp32). SchemeSpec::kind() is derived from it.
using SchemeParams = detail::VariantOfRest<void
#define KVQ_SCHEME_FAMILY(folder, Name, ...) , Name##Spec
#include "schemes/families.def"
#undef KVQ_SCHEME_FAMILY
                                           >::type;

/// \brief rot=hadamard[:SEED]: which rotation a side's vectors are stored under.
struct RotSpec {
  bool on = false;
  bool seeded = false;  ///< random signs from `seed`; unseeded: all signs +1 (llama.cpp's)
  uint64_t seed = 0;
  bool operator==(const RotSpec&) const = default;
};

struct SchemeSpec;
/// \brief SPEC@LAYERS=SPEC: the layers (sorted) that take `spec` instead of the first one.
struct LayerOverride {
  std::vector<int> layers;
  std::shared_ptr<const SchemeSpec> spec;
};

/// \brief A parsed scheme spec. A split spec (k=...;v=...) holds each side's scheme; its own
/// params are the key side's. Code that stores or measures one side asks side(role).
struct SchemeSpec {
  SchemeParams params;  ///< the scheme's own keys (default: fp32)
  /// \brief The kind, from params.
  SchemeKind kind() const {
    return std::visit([](const auto& p) { return p.kind(); }, params);
  }
  /// \brief The parameters of family P (FloatSpec, Fp8Spec, IntSpec); throws kvq::Error naming
  /// the spec when it is of another family.
  template <class P>
  const P& as() const {
    if (const P* p = std::get_if<P>(&params)) return *p;
    wrong_family(P::kFamily);
  }
  template <class P>
  P& as() {
    if (P* p = std::get_if<P>(&params)) return *p;
    wrong_family(P::kFamily);
  }
  template <class P>
  bool is() const {
    return std::holds_alternative<P>(params);
  }
  const Fp8Spec& fp8() const { return as<Fp8Spec>(); }
  Fp8Spec& fp8() { return as<Fp8Spec>(); }
  const IntSpec& q() const { return as<IntSpec>(); }
  IntSpec& q() { return as<IntSpec>(); }
  RotSpec rot;   ///< rot=hadamard[:SEED]
  int sink = 0;  ///< sink=S: the first S tokens exact
  /// Both set for a split spec, both null otherwise.
  std::shared_ptr<const SchemeSpec> key_side, value_side;
  /// \brief Canonical spelling with every parameter explicit (stable across runs: a result key);
  /// "k=KEY;v=VALUE" for a split spec.
  std::string canonical() const;
  bool split() const { return value_side != nullptr; }
  /// \brief The scheme of one side: this spec, or the side's own for a split spec.
  const SchemeSpec& side(Role r) const {
    return !split() ? *this : r == Role::Key ? *key_side : *value_side;
  }
  /// \brief This (one-side) spec without rot= and sink=: the scheme that quantizes what is left.
  SchemeSpec base() const;

  /// Per-layer schemes (SPEC@LAYERS=SPEC), each layer listed once; empty: every layer this one.
  std::vector<LayerOverride> layers;
  /// SPEC@first=F,last=L: the first F and the last L layers take the exact fp32 cache unless
  /// `layers` names them. `model_layers`: the model's layer count once resolve_layers() has run
  /// (-1 before: for_layer() of a layer that last= might cover throws).
  int keep_first = 0, keep_last = 0;
  int64_t model_layers = -1;
  bool layered() const { return !layers.empty() || keep_first > 0 || keep_last > 0; }
  /// \brief The scheme of model layer `l` (without per-layer overrides of its own); -1: the
  /// first spec.
  SchemeSpec for_layer(int l) const;
  /// \brief The first spec and every override's, each once (what must fit a cache's shape).
  std::vector<SchemeSpec> distinct_layer_specs() const;
  /// \brief The largest layer index an override names (-1: none).
  int max_layer() const;

 private:
  [[noreturn]] void wrong_family(std::string_view family) const;
};

/// \brief Throws kvq::Error when a per-layer spec names a layer that `model` (a name for the
/// message) with `layers` layers does not have, or its first=/last= preset keeps every layer exact.
void check_layers(const SchemeSpec& s, int64_t layers, std::string_view model);

/// \brief `s` checked (check_layers) and resolved for a model of `layers` layers: for_layer()
/// then answers every layer, last= included. The canonical name is unchanged.
SchemeSpec resolve_layers(const SchemeSpec& s, int64_t layers, std::string_view model);

/// \brief `s` with rot=`r` on each side that has none (what the model's --hadamard flag adds).
SchemeSpec with_rotation(const SchemeSpec& s, const RotSpec& r);

/// \brief Parses a spec string; throws kvq::Error naming the bad part and listing what is allowed.
SchemeSpec parse_spec(std::string_view text);

std::string_view to_string(Role r);

}  // namespace kvq
