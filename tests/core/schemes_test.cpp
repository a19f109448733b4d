// core/schemes: the registry sweep. Every registered family's examples round-trip through their
// canonical names, every key a family declares is exercised by an example and named by the error
// for an unknown key, and every name, alias and key list is in the --help listing. Expected values
// are the examples themselves (canonical by construction) and the registry's own declarations.
#include "core/schemes.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/support/expect_error.h"

namespace kvq {
namespace {

using kvq::testing::expect_error;

TEST(SchemeRegistry, EveryKindHasOneFamily) {
  std::set<SchemeKind> seen;
  for (const SchemeTraits* t : scheme_families())
    for (const SchemeKindName& k : t->kinds) {
      EXPECT_TRUE(seen.insert(k.kind).second) << "kind registered twice: " << k.label;
      EXPECT_EQ(&scheme_traits(k.kind), t);
      EXPECT_EQ(kind_label(k.kind), k.label);
    }
  // SchemeKind's enumerators, all of them (schemes/kinds.h).
  for (const SchemeKind k :
       {SchemeKind::Fp32, SchemeKind::Bf16, SchemeKind::Fp16, SchemeKind::Fp8, SchemeKind::Int})
    EXPECT_TRUE(seen.count(k)) << "kind " << static_cast<int>(k) << " has no family";
  EXPECT_EQ(scheme_kinds().size(), seen.size());
}

// parse(canonical(s)) == s, and each example is already canonical (a result key).
TEST(SchemeRegistry, ExamplesRoundTripThroughCanonicalNames) {
  for (const SchemeTraits* t : scheme_families()) {
    ASSERT_FALSE(t->examples.empty()) << t->family;
    for (const std::string_view e : t->examples) {
      SCOPED_TRACE(std::string(e));
      const SchemeSpec s = parse_spec(e);
      EXPECT_EQ(&scheme_traits(s), t);
      EXPECT_EQ(s.canonical(), e);
      const SchemeSpec back = parse_spec(s.canonical());
      EXPECT_TRUE(back.params == s.params);
      EXPECT_EQ(back.rot, s.rot);
      EXPECT_EQ(back.sink, s.sink);
    }
  }
}

// Every key a family takes appears in one of its examples (so the sweeps above and in
// tests/cache/schemes_test.cpp cover it), and an unknown key's error lists them all.
TEST(SchemeRegistry, EveryKeyIsSweptAndListedInErrors) {
  for (const SchemeTraits* t : scheme_families())
    for (const std::string_view e : t->examples) {
      SCOPED_TRACE(std::string(e));
      const SchemeSpec s = parse_spec(e);
      const std::string bad = std::string(e) + (e.find(':') == e.npos ? ":" : ",") + "bogus=1";
      const std::string msg =
          expect_error([&] { (void)parse_spec(bad); }, "unknown parameter 'bogus'");
      for (const SchemeKey& k : t->keys(s)) {
        EXPECT_NE(msg.find(std::string(k.name)), std::string::npos) << msg << " lacks " << k.name;
        bool used = false;
        for (const std::string_view x : t->examples) {
          if (t->keys(parse_spec(x)).data() != t->keys(s).data()) continue;  // int<B> vs kivi<B>
          if (x.find(':') == x.npos) continue;
          for (const std::string_view kv : scheme_parse::split(x.substr(x.find(':') + 1), ','))
            used = used || kv.substr(0, kv.find('=')) == k.name;
        }
        EXPECT_TRUE(used) << t->family << " key '" << k.name << "' is in no example";
      }
      EXPECT_NE(msg.find("rot"), std::string::npos);
      EXPECT_NE(msg.find("sink"), std::string::npos);
    }
}

TEST(SchemeRegistry, AliasesParseToTheirFamily) {
  for (const SchemeTraits* t : scheme_families())
    for (const SchemeAlias& a : t->aliases) {
      SCOPED_TRACE(std::string(a.name));
      EXPECT_EQ(&scheme_traits(parse_spec(a.name)), t);
    }
  // The two aliases by definition: vLLM's fp8 is E4M3; HF's defaults are 4 bits, groups of 64 along
  // head_dim, 128 recent tokens.
  EXPECT_EQ(parse_spec("fp8").canonical(), "fp8_e4m3:gran=tensor,scale=dynamic");
  EXPECT_EQ(parse_spec("hf").canonical(), "int4:k=token,v=token,g=64,r=128");
}

TEST(SchemeRegistry, HelpAndErrorsNameEveryScheme) {
  const std::string help = scheme_help(), names = scheme_names();
  for (const SchemeTraits* t : scheme_families()) {
    EXPECT_NE(help.find(std::string(t->names)), std::string::npos) << t->family;
    EXPECT_NE(help.find(std::string(t->keys_help)), std::string::npos) << t->family;
    EXPECT_NE(help.find(std::string(t->description)), std::string::npos) << t->family;
    EXPECT_NE(names.find(std::string(t->names)), std::string::npos) << t->family;
    for (const SchemeAlias& a : t->aliases)
      EXPECT_NE(help.find(std::string(a.name)), std::string::npos) << a.name;
  }
  // The list parse_spec's errors give, as it always read (scripts and tests match on it).
  EXPECT_EQ(names,
            "fp32, bf16, fp16, fp8_e4m3 (alias fp8), fp8_e4m3fnuz, fp8_e5m2, int2|int3|int4|int8, "
            "kivi2|kivi3|kivi4|kivi8, hf (HF QuantizedCache's names), k=SPEC;v=SPEC");
  expect_error([] { (void)parse_spec("nf4"); }, "unknown scheme 'nf4' (allowed: " + names + ")");
}

// A key's declared default is the default: NAME and NAME:key=default,... (every valued key of the
// example's scheme written out) parse to the same spec, and each flag changes it (off unless
// written). Expected: the parse of the bare name, the family's own definition of its defaults.
TEST(SchemeRegistry, KeyDefaultsParseAsTheBareName) {
  for (const SchemeTraits* t : scheme_families())
    for (const std::string_view e : t->examples) {
      const std::string name(e.substr(0, e.find(':')));
      SCOPED_TRACE(name);
      const SchemeSpec bare = parse_spec(name);
      std::string all;
      for (const SchemeKey& k : t->keys(bare)) {
        if (k.flag) {
          EXPECT_TRUE(k.value.empty()) << k.name;
          continue;
        }
        ASSERT_FALSE(k.value.empty()) << t->family << " key '" << k.name << "' has no default";
        all += fmt::format("{}{}={}", all.empty() ? "" : ",", k.name, k.value);
      }
      if (all.empty()) continue;
      EXPECT_TRUE(parse_spec(name + ":" + all).params == bare.params) << all;
      for (const SchemeKey& k : t->keys(bare)) {
        if (!k.flag) continue;
        const std::string on = fmt::format("{}:{},{}", name, all, k.name);
        EXPECT_FALSE(parse_spec(on).params == bare.params) << on;
      }
    }
}

// Every family lists its parameters with the kind first (Python's Spec.kind): the float kinds by
// their label, fp8 and int by the family's name.
TEST(SchemeRegistry, FieldsNameTheKindFirst) {
  for (const SchemeTraits* t : scheme_families())
    for (const std::string_view e : t->examples) {
      SCOPED_TRACE(std::string(e));
      const SchemeSpec s = parse_spec(e);
      const std::vector<SchemeField> f = t->fields(s);
      ASSERT_FALSE(f.empty());
      EXPECT_EQ(f[0].name, "kind");
      const std::string kind = std::get<std::string>(f[0].value);
      EXPECT_TRUE(kind == kind_label(s.kind()) || kind == t->family) << kind;
      std::set<std::string_view> names;
      for (const SchemeField& x : f) EXPECT_TRUE(names.insert(x.name).second) << x.name;
    }
}

// The checked accessors: a family's parameters from a spec of another family is an error naming it.
TEST(SchemeRegistry, AccessorsCheckTheFamily) {
  const SchemeSpec k = parse_spec("kivi2");
  EXPECT_EQ(k.q().bits, 2);
  EXPECT_TRUE(k.is<IntSpec>());
  EXPECT_FALSE(k.is<Fp8Spec>());
  expect_error([&] { (void)k.fp8(); }, "scheme 'kivi2:g=32,r=128' is not an fp8 scheme");
  expect_error([] { (void)parse_spec("bf16").q(); }, "scheme 'bf16' is not an int / kivi scheme");
  EXPECT_EQ(SchemeSpec{}.kind(), SchemeKind::Fp32);  // the default is the exact cache
}

}  // namespace
}  // namespace kvq
