// Hugging Face tokenizer.json (+ tokenizer_config.json) as a source for the BPE engine
// (tokenizer.h, tokenizer.cpp). The subset read, which is what the Llama, Mistral, Qwen and
// SmolLM2 families ship; anything else is a one-line kvq::Error naming the file and the key:
//   model          BPE: vocab, merges ("a b" strings or [a, b] pairs), unk_token, fuse_unk,
//                  byte_fallback, ignore_merges (dropout null or 0, no continuing_subword_prefix
//                  or end_of_word_suffix). Unigram, WordPiece, WordLevel are refused.
//   added_tokens   id, content, special, lstrip, rstrip, single_word, normalized.
//   normalizer     null, Sequence, Prepend, Replace (String pattern), NFC.
//   pre_tokenizer  null, Sequence, Split (String or Regex pattern, every delimiter behaviour,
//                  invert), ByteLevel (add_prefix_space, use_regex: GPT-2's regex), Digits,
//                  Metaspace (replacement, prepend_scheme first/always/never or the older
//                  add_prefix_space, split). ByteLevel makes the model byte-level; it must be the
//                  last step.
//   post_processor null, ByteLevel, Sequence, TemplateProcessing (its "single" template: the
//                  special tokens before and after $A are encode(..., add_special)'s).
//   decoder        null (tokens joined by " "), Sequence, ByteLevel, Replace (String),
//   ByteFallback,
//                  Fuse, Strip, Metaspace.
// Split's Regex patterns are Oniguruma's (Ruby syntax) in `tokenizers`; PCRE2 compiles the file's
// pattern with UTF + UCP after a check that refuses what the two read differently: \h and \H
// (Oniguruma: hex digit; PCRE2: horizontal space), the absent operator (?~...), and ^ / $ (line
// anchors in Ruby), so that a pattern either means the same in both or does not load.
// tokenizer_config.json: bos_token, eos_token, pad_token, unk_token (a string or an AddedToken
// object), chat_template (a string, or a list of {name, template} whose "default" is used),
// add_bos_token / add_eos_token (used only when tokenizer.json has no post_processor).
// chat_template.jinja beside them, when present, is the chat template (transformers >= 4.43).
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io.h"
#include "model/tokenizer.h"
#include "model/tokenizer_internal.h"

namespace kvq {

using nlohmann::json;

struct Tokenizer::JsonLoader {
  using P = Pipeline;
  JsonLoader(const std::string& n, Tokenizer& tk) : name(n), t(tk) {}
  const std::string& name;
  Tokenizer& t;
  std::shared_ptr<Pipeline> pipe = std::make_shared<Pipeline>();
  std::vector<std::string> pre_names;
  bool pre_byte_level = false;
  int steps = 0;  // normalizer, pre-tokenizer, decoder and post-processor entries, nested or not
  static constexpr int kMaxSteps = 64;

  void count_step(const std::string& where) {
    if (++steps > kMaxSteps)
      bad(where, fmt::format("more than {} normalizer/pre-tokenizer/decoder/post-processor steps "
                             "in all",
                             kMaxSteps));
  }

  [[noreturn]] void bad(const std::string& where, const std::string& what) const {
    fail("tokenizer: {}: {}: {}", name, where, what);
  }
  const json& need(const json& obj, const char* key, const std::string& where) const {
    if (!obj.is_object()) bad(where, "expected an object");
    const auto it = obj.find(key);
    if (it == obj.end()) bad(where, fmt::format("missing \"{}\"", key));
    return *it;
  }
  std::string str(const json& obj, const char* key, const std::string& where) const {
    const json& v = need(obj, key, where);
    if (!v.is_string()) bad(where + "." + key, "expected a string");
    return v.get<std::string>();
  }
  bool flag(const json& obj, const char* key, bool dflt, const std::string& where) const {
    if (!obj.is_object()) bad(where, "expected an object");
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) bad(where + "." + key, "expected true or false");
    return it->get<bool>();
  }
  int64_t integer(const json& v, const std::string& where, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer()) bad(where, "expected an integer");
    const auto x = v.get<int64_t>();
    if (x < lo || x > hi) bad(where, fmt::format("{} is outside [{}, {}]", x, lo, hi));
    return x;
  }
  // A Split/Replace pattern object: {"String": s} (literal) or {"Regex": r}.
  std::string pattern(const json& obj, const std::string& where, bool* is_regex) const {
    const json& p = need(obj, "pattern", where);
    if (p.is_object() && p.contains("String") && p["String"].is_string()) {
      *is_regex = false;
      return p["String"].get<std::string>();
    }
    if (p.is_object() && p.contains("Regex") && p["Regex"].is_string()) {
      *is_regex = true;
      return p["Regex"].get<std::string>();
    }
    bad(where + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
  }
  // The file's Oniguruma pattern for PCRE2, refusing what the two read differently.
  tok::Regex regex(const std::string& pat, const std::string& where) const {
    bool in_class = false;
    for (size_t i = 0; i < pat.size(); ++i) {
      const char c = pat[i];
      if (c == '\\' && i + 1 < pat.size()) {
        const char e = pat[++i];
        if ((e == 'p' || e == 'P') && i + 1 < pat.size() && pat[i + 1] == '{') {
          i = pat.find('}', i);  // \p{^L}: not an anchor
          if (i == std::string::npos) break;
          continue;
        }
        if (e == 'h' || e == 'H')
          bad(where, fmt::format("regex /{}/ uses \\{} (a hex digit in Oniguruma, horizontal space "
                                 "in PCRE2); not supported",
                                 pat, e));
        continue;
      }
      if (in_class) {
        if (c == ']') in_class = false;
        if ((c == '[' && pat.compare(i, 2, "[:") != 0) || pat.compare(i, 2, "&&") == 0)
          bad(where, fmt::format("regex /{}/ nests a character class or uses && in one (Oniguruma "
                                 "set operations); not supported",
                                 pat));
        continue;
      }
      if (c == '[') {
        in_class = true;
        if (i + 1 < pat.size() && pat[i + 1] == '^') ++i;
        if (i + 1 < pat.size() && pat[i + 1] == ']') ++i;  // a literal ] first in the class
      } else if (c == '^' || c == '$') {
        bad(where, fmt::format("regex /{}/ uses the anchor {} (a line anchor in Oniguruma); not "
                               "supported",
                               pat, c));
      } else if (c == '(' && pat.compare(i, 3, "(?~") == 0) {
        bad(where,
            fmt::format("regex /{}/ uses Oniguruma's absent operator (?~...); not supported", pat));
      }
    }
    return tok::Regex(pat, name + ": " + where);
  }
  static std::string quote_literal(const std::string& s) {
    std::string r = "\\Q";
    for (size_t i = 0; i < s.size(); ++i) {
      if (s.compare(i, 2, "\\E") == 0) {
        r += "\\E\\\\E\\Q";
        ++i;
      } else {
        r.push_back(s[i]);
      }
    }
    return r + "\\E";
  }

  void normalizer(const json& n, const std::string& where) {
    if (n.is_null()) return;
    count_step(where);
    const std::string type = str(n, "type", where);
    if (type == "Sequence") {
      const json& list = need(n, "normalizers", where);
      if (!list.is_array()) bad(where + ".normalizers", "expected an array");
      for (size_t i = 0; i < list.size(); ++i)
        normalizer(list[i], fmt::format("{}.normalizers[{}]", where, i));
    } else if (type == "Prepend") {
      pipe->norm.push_back({P::Norm::kPrepend, str(n, "prepend", where), ""});
    } else if (type == "Replace") {
      bool re = false;
      std::string a = pattern(n, where, &re);
      if (re) bad(where, "Replace with a Regex pattern is not supported (only String)");
      pipe->norm.push_back({P::Norm::kReplace, std::move(a), str(n, "content", where)});
    } else if (type == "NFC") {
      pipe->norm.push_back({P::Norm::kNfc, "", ""});
    } else {
      bad(where, fmt::format("normalizer '{}' is not supported (Sequence, Prepend, Replace, NFC "
                             "are)",
                             type));
    }
  }

  void pre_tokenizer(const json& p, const std::string& where) {
    if (p.is_null()) return;
    count_step(where);
    const std::string type = str(p, "type", where);
    if (pre_byte_level) bad(where, "a pre-tokenizer step after ByteLevel is not supported");
    if (type == "Sequence") {
      const json& list = need(p, "pretokenizers", where);
      if (!list.is_array()) bad(where + ".pretokenizers", "expected an array");
      for (size_t i = 0; i < list.size(); ++i)
        pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i));
      return;
    }
    pre_names.push_back(type);
    P::PreStep s;
    if (type == "Split") {
      bool re = false;
      const std::string pat = pattern(p, where, &re);
      if (pat.empty()) bad(where + ".pattern", "is empty");
      s.re =
          re ? regex(pat, where + ".pattern") : tok::Regex(quote_literal(pat), name + ": " + where);
      const std::string b = str(p, "behavior", where);
      s.behavior = b == "Isolated"             ? P::Behavior::kIsolated
                   : b == "Removed"            ? P::Behavior::kRemoved
                   : b == "MergedWithPrevious" ? P::Behavior::kMergedWithPrevious
                   : b == "MergedWithNext"     ? P::Behavior::kMergedWithNext
                   : b == "Contiguous"
                       ? P::Behavior::kContiguous
                       : (bad(where + ".behavior", fmt::format("unknown behavior '{}'", b)),
                          P::Behavior::kIsolated);
      s.invert = flag(p, "invert", false, where);
      pipe->pre.push_back(std::move(s));
    } else if (type == "Digits") {
      s.re = tok::Regex(tok::kDigitPattern, name + ": " + where);
      s.behavior = flag(p, "individual_digits", false, where) ? P::Behavior::kIsolated
                                                              : P::Behavior::kContiguous;
      pipe->pre.push_back(std::move(s));
    } else if (type == "ByteLevel") {
      if (flag(p, "add_prefix_space", false, where)) {
        P::PreStep ps;
        ps.kind = P::Pre::kPrefixSpace;
        pipe->pre.push_back(std::move(ps));
      }
      if (flag(p, "use_regex", true, where)) {
        s.re = tok::Regex(tok::kGpt2Pattern, name + ": " + where);
        pipe->pre.push_back(std::move(s));
      }
      pre_byte_level = true;
    } else if (type == "Metaspace") {
      s.kind = P::Pre::kMetaspace;
      s.replacement = str(p, "replacement", where);
      if (s.replacement.empty()) bad(where + ".replacement", "is empty");
      s.prepend = prepend_scheme(p, where);
      s.split = flag(p, "split", true, where);
      s.re = tok::Regex(quote_literal(s.replacement), name + ": " + where);
      s.behavior = P::Behavior::kMergedWithNext;
      pipe->pre.push_back(std::move(s));
    } else {
      bad(where, fmt::format("pre-tokenizer '{}' is not supported (Sequence, Split, ByteLevel, "
                             "Digits, Metaspace are)",
                             type));
    }
  }
  P::Prepend prepend_scheme(const json& p, const std::string& where) const {
    if (p.contains("prepend_scheme") && !p["prepend_scheme"].is_null()) {
      const std::string s = str(p, "prepend_scheme", where);
      if (s == "first") return P::Prepend::kFirst;
      if (s == "always") return P::Prepend::kAlways;
      if (s == "never") return P::Prepend::kNever;
      bad(where + ".prepend_scheme", fmt::format("unknown scheme '{}'", s));
    }
    return flag(p, "add_prefix_space", true, where) ? P::Prepend::kAlways : P::Prepend::kNever;
  }

  // The decoder as per-token steps (applied to every token's text into bytes_) and the
  // whole-sequence ones (Strip after Fuse, Metaspace's first-token rule).
  struct TokenStep {
    enum { kByteLevel, kReplace, kByteFallback, kStrip } kind;
    std::string a, b;
    int start = 0, stop = 0;
  };
  std::vector<TokenStep> dec;
  bool fused = false, has_decoder = false;
  void decoder(const json& d, const std::string& where) {
    if (d.is_null()) return;
    count_step(where);
    has_decoder = true;
    const std::string type = str(d, "type", where);
    if (type == "Sequence") {
      const json& list = need(d, "decoders", where);
      if (!list.is_array()) bad(where + ".decoders", "expected an array");
      for (size_t i = 0; i < list.size(); ++i)
        decoder(list[i], fmt::format("{}.decoders[{}]", where, i));
    } else if (type == "ByteLevel") {
      dec.push_back({TokenStep::kByteLevel, "", ""});
    } else if (type == "Replace") {
      bool re = false;
      std::string a = pattern(d, where, &re);
      if (re) bad(where, "Replace with a Regex pattern is not supported (only String)");
      if (a.empty()) bad(where + ".pattern", "is empty");
      dec.push_back({TokenStep::kReplace, std::move(a), str(d, "content", where)});
    } else if (type == "ByteFallback") {
      dec.push_back({TokenStep::kByteFallback, "", ""});
    } else if (type == "Fuse") {
      fused = true;
    } else if (type == "Strip") {
      const std::string c = str(d, "content", where);
      if (c != " ") bad(where + ".content", "only \" \" is supported");
      const int start = static_cast<int>(integer(need(d, "start", where), where + ".start", 0, 64));
      const int stop = static_cast<int>(integer(need(d, "stop", where), where + ".stop", 0, 64));
      if (fused) {
        t.strip_start_ = start;
        t.strip_stop_ = stop;
      } else {
        dec.push_back({TokenStep::kStrip, "", "", start, stop});
      }
    } else if (type == "Metaspace") {
      const std::string r = str(d, "replacement", where);
      if (r.empty()) bad(where + ".replacement", "is empty");
      dec.push_back({TokenStep::kReplace, r, " "});
      t.strip_first_token_space_ = prepend_scheme(d, where) != P::Prepend::kNever;
    } else {
      bad(where, fmt::format("decoder '{}' is not supported (Sequence, ByteLevel, Replace, "
                             "ByteFallback, Fuse, Strip, Metaspace are)",
                             type));
    }
  }
  std::string decode_token(const std::string& text) const {
    std::string s = text, tmp;
    for (const auto& d : dec) {
      switch (d.kind) {
        case TokenStep::kByteLevel:
          if (tok::unmap_bytes(s, tmp)) s = tmp;
          break;
        case TokenStep::kReplace:
          s = tok::replace_all(s, d.a, d.b);
          break;
        case TokenStep::kByteFallback:
          if (s.size() == 6 && s.starts_with("<0x") && s.ends_with('>') &&
              std::isxdigit(static_cast<unsigned char>(s[3])) &&
              std::isxdigit(static_cast<unsigned char>(s[4])))
            s = std::string(1, static_cast<char>(std::stoi(s.substr(3, 2), nullptr, 16)));
          break;
        case TokenStep::kStrip: {
          size_t a = 0, z = s.size();
          while (a < z && static_cast<int>(a) < d.start && s[a] == ' ') ++a;
          for (int k = 0; k < d.stop && z > a && s[z - 1] == ' '; ++k) --z;
          s = s.substr(a, z - a);
          break;
        }
      }
    }
    return s;
  }

  void post_processor(const json& p, const std::string& where, const json& vocab_ids) {
    if (p.is_null()) return;
    count_step(where);
    const std::string type = str(p, "type", where);
    if (type == "Sequence") {
      const json& list = need(p, "processors", where);
      if (!list.is_array()) bad(where + ".processors", "expected an array");
      for (size_t i = 0; i < list.size(); ++i)
        post_processor(list[i], fmt::format("{}.processors[{}]", where, i), vocab_ids);
    } else if (type == "ByteLevel") {
      // offsets only
    } else if (type == "TemplateProcessing") {
      const json& single = need(p, "single", where);
      const json& specials = need(p, "special_tokens", where);
      if (!single.is_array()) bad(where + ".single", "expected an array");
      bool seen_a = false;
      for (size_t i = 0; i < single.size(); ++i) {
        const std::string w = fmt::format("{}.single[{}]", where, i);
        const json& item = single[i];
        if (item.is_object() && item.contains("Sequence")) {
          if (str(item["Sequence"], "id", w) != "A" || seen_a)
            bad(w, "the single template must hold $A once (no $B)");
          seen_a = true;
        } else if (item.is_object() && item.contains("SpecialToken")) {
          const std::string id = str(item["SpecialToken"], "id", w);
          const json& st = need(specials, id.c_str(), where + ".special_tokens");
          const json& ids = need(st, "ids", where + ".special_tokens." + id);
          if (!ids.is_array()) bad(where + ".special_tokens." + id + ".ids", "expected an array");
          for (const json& x : ids) {
            const auto v =
                static_cast<int32_t>(integer(x, where + ".special_tokens." + id + ".ids", 0,
                                             static_cast<int64_t>(t.text_.size()) - 1));
            (seen_a ? t.suffix_ : t.prefix_).push_back(v);
          }
        } else {
          bad(w, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
        }
      }
      if (!seen_a) bad(where + ".single", "has no $A");
    } else {
      bad(where, fmt::format("post-processor '{}' is not supported (Sequence, ByteLevel, "
                             "TemplateProcessing are)",
                             type));
    }
    (void)vocab_ids;
  }

  void load(const json& j, const json* config, std::string_view jinja) {
    if (!j.is_object()) bad("top level", "expected an object");
    const json& model = need(j, "model", "top level");
    if (!model.is_object()) bad("model", "expected an object");
    const std::string type = model.contains("type") ? str(model, "type", "model") : "BPE";
    if (type != "BPE")
      bad("model.type", fmt::format("model type '{}' is not supported (only BPE)", type));
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(key) && !model[key].is_null() &&
          !(model[key].is_string() && model[key].get<std::string>().empty()))
        bad(std::string("model.") + key, "is not supported (must be null)");
    }
    if (model.contains("dropout") && !model["dropout"].is_null() &&
        !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
      bad("model.dropout", "BPE dropout is not supported (must be null)");

    const json& vocab = need(model, "vocab", "model");
    if (!vocab.is_object()) bad("model.vocab", "expected an object");
    if (!model.contains("merges")) bad("model", "missing \"merges\"");
    const json empty_array = json::array();
    const json& added = j.contains("added_tokens") && !j["added_tokens"].is_null()
                            ? j["added_tokens"]
                            : empty_array;
    if (!added.is_array()) bad("added_tokens", "expected an array");
    const size_t un = vocabulary(vocab, added);

    // Model options.
    t.ignore_merges_ = flag(model, "ignore_merges", false, "model");
    t.fuse_unk_ = flag(model, "fuse_unk", false, "model");
    const bool byte_fallback = flag(model, "byte_fallback", false, "model");
    if (model.contains("unk_token") && !model["unk_token"].is_null()) {
      const std::string u = str(model, "unk_token", "model");
      const auto it = t.vocab_.find(u);
      if (it == t.vocab_.end())
        bad("model.unk_token", fmt::format("'{}' is not in the vocabulary", u));
      t.model_unk_ = it->second;
      t.unk_ = it->second;
    }

    normalizer(j.contains("normalizer") ? j["normalizer"] : json(), "normalizer");
    pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(), "pre_tokenizer");
    decoder(j.contains("decoder") ? j["decoder"] : json(), "decoder");
    t.byte_level_ = pre_byte_level;
    t.pre_ = pre_names.empty() ? "none" : fmt::format("{}", fmt::join(pre_names, "+"));
    byte_tokens(byte_fallback);
    merge_ranks(model["merges"]);
    added_tokens(added);
    pipe->word_char = tok::Regex(R"([\p{Alphabetic}\p{N}])", name + ": single_word");

    // What each token decodes to in mid-sequence.
    t.bytes_.resize(un);
    for (size_t i = 0; i < un; ++i) t.bytes_[i] = decode_token(t.text_[i]);
    if (!has_decoder) bad("decoder", "is null; kvq needs one (ByteLevel, or the Metaspace chain)");

    post_processor(j.contains("post_processor") ? j["post_processor"] : json(), "post_processor",
                   vocab);
    const bool has_post = j.contains("post_processor") && !j["post_processor"].is_null();
    special_tokens_and_template(config, jinja, has_post);
  }

  // Vocabulary and added tokens' ids: unique per source, (nearly) contiguous; holes decode to
  // nothing. Sets the vocabulary's token texts; returns the id count.
  size_t vocabulary(const json& vocab, const json& added) {
    constexpr int64_t kMaxId = (1 << 30) - 1;
    int64_t n = 0;
    for (const auto& [tok_text, v] : vocab.items())
      n = std::max(n, integer(v, "model.vocab[\"" + tok_text + "\"]", 0, kMaxId) + 1);
    for (size_t i = 0; i < added.size(); ++i)
      n = std::max(n, integer(need(added[i], "id", fmt::format("added_tokens[{}]", i)),
                              fmt::format("added_tokens[{}].id", i), 0, kMaxId) +
                          1);
    if (n == 0) bad("model.vocab", "is empty");
    // Ids are (nearly) contiguous in every real file; a few holes decode to nothing.
    const auto entries = static_cast<int64_t>(vocab.size() + added.size());
    if (n > 2 * entries + 1024)
      bad("model.vocab", fmt::format("ids reach {} for {} tokens; they must be (nearly) contiguous",
                                     n - 1, entries));
    const auto un = static_cast<size_t>(n);
    t.text_.assign(un, "");
    t.special_.assign(un, 0);
    std::vector<uint8_t> defined(un, 0);
    for (const auto& [tok_text, v] : vocab.items()) {
      const auto id = static_cast<size_t>(v.get<int64_t>());
      if (defined[id]) bad("model.vocab", fmt::format("id {} is used twice", id));
      defined[id] = 1;
      t.text_[id] = tok_text;
      t.vocab_.emplace(tok_text, static_cast<int32_t>(id));
    }
    if (t.vocab_.size() != vocab.size()) bad("model.vocab", "has a token twice");

    return un;
  }

  // The byte fallback (<0xNN> tokens) and, for a byte-level pre-tokenizer, each byte's token.
  void byte_tokens(bool byte_fallback) {
    std::fill(std::begin(t.fallback_), std::end(t.fallback_), -1);
    std::fill(std::begin(t.byte_token_), std::end(t.byte_token_), -1);
    for (int b = 0; b < 256; ++b) {
      if (byte_fallback) {
        const auto it = t.vocab_.find(fmt::format("<0x{:02X}>", b));
        if (it != t.vocab_.end()) t.fallback_[b] = it->second;
      }
      if (t.byte_level_) {
        std::string one;
        tok::append_utf8(one, tok::byte_to_codepoint()[b]);
        const auto it = t.vocab_.find(one);
        if (it != t.vocab_.end()) t.byte_token_[b] = it->second;
      } else {
        t.byte_token_[b] = t.fallback_[b];
      }
    }
  }

  // Merges: "a b" or ["a", "b"], in rank order; both halves and their join in the vocabulary.
  void merge_ranks(const json& merges) {
    if (!merges.is_array()) bad("model.merges", "expected an array");
    t.merges_.reserve(merges.size());
    std::string left, right;
    for (size_t r = 0; r < merges.size(); ++r) {
      const json& m = merges[r];
      if (m.is_string()) {
        const std::string& s = m.get_ref<const std::string&>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          bad(fmt::format("model.merges[{}]", r), fmt::format("'{}' is not 'left right'", s));
        left = s.substr(0, sp);
        right = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        bad(fmt::format("model.merges[{}]", r), "expected \"left right\" or [left, right]");
      }
      const auto l = t.vocab_.find(left), rt = t.vocab_.find(right),
                 jn = t.vocab_.find(left + right);
      if (l == t.vocab_.end() || rt == t.vocab_.end() || jn == t.vocab_.end())
        bad(fmt::format("model.merges[{}]", r),
            fmt::format("('{}', '{}') names a token not in the vocabulary", left, right));
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(l->second)) << 32) |
                           static_cast<uint32_t>(rt->second);
      t.merges_.emplace(key, Merge{static_cast<int32_t>(r), jn->second});  // first rank wins
    }
  }

  // Added tokens: their content is their text; matched before the model.
  void added_tokens(const json& added) {
    for (size_t i = 0; i < added.size(); ++i) {
      const std::string w = fmt::format("added_tokens[{}]", i);
      const json& a = added[i];
      const auto id = static_cast<int32_t>(a["id"].get<int64_t>());
      const std::string content = str(a, "content", w);
      if (content.empty()) bad(w + ".content", "is empty");
      t.text_[static_cast<size_t>(id)] = content;
      const bool special = flag(a, "special", false, w);
      t.special_[static_cast<size_t>(id)] = special ? 1 : 0;
      const Added entry{id, special, flag(a, "lstrip", false, w), flag(a, "rstrip", false, w),
                        flag(a, "single_word", false, w)};
      (flag(a, "normalized", !special, w) ? t.added_norm_ : t.added_raw_).push_back(entry);
    }
  }

  // tokenizer_config.json: special token names, add_bos/eos without a post-processor (`has_post`:
  // it adds them), the chat template (`jinja`: chat_template.jinja's, else the config's).
  void special_tokens_and_template(const json* config, std::string_view jinja, bool has_post) {
    std::string tmpl(jinja);
    if (config != nullptr) {
      const json& c = *config;
      const std::string cname = "tokenizer_config.json";
      if (!c.is_object()) bad(cname, "expected an object");
      auto token_id = [&](const char* key) -> int32_t {
        if (!c.contains(key) || c[key].is_null()) return -1;
        const json& v = c[key];
        std::string content;
        if (v.is_string())
          content = v.get<std::string>();
        else if (v.is_object() && v.contains("content") && v["content"].is_string())
          content = v["content"].get<std::string>();
        else
          bad(cname + "." + key, "expected a string or {\"content\": ...}");
        for (const auto* list : {&t.added_raw_, &t.added_norm_})
          for (const Added& a : *list)
            if (t.text_[static_cast<size_t>(a.id)] == content) return a.id;
        const auto it = t.vocab_.find(content);
        if (it == t.vocab_.end())
          bad(cname + "." + key, fmt::format("'{}' is not a token of tokenizer.json", content));
        return it->second;
      };
      t.bos_ = token_id("bos_token");
      t.eos_ = token_id("eos_token");
      t.pad_ = token_id("pad_token");
      if (const int32_t u = token_id("unk_token"); u >= 0) t.unk_ = u;
      if (!has_post) {
        if (flag(c, "add_bos_token", false, cname) && t.bos_ >= 0) t.prefix_.push_back(t.bos_);
        if (flag(c, "add_eos_token", false, cname) && t.eos_ >= 0) t.suffix_.push_back(t.eos_);
      }
      if (tmpl.empty() && c.contains("chat_template") && !c["chat_template"].is_null()) {
        const json& ct = c["chat_template"];
        if (ct.is_string()) {
          tmpl = ct.get<std::string>();
        } else if (ct.is_array()) {
          for (const json& e : ct)
            if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
                e["template"].is_string())
              tmpl = e["template"].get<std::string>();
          if (tmpl.empty()) bad(cname + ".chat_template", "has no template named \"default\"");
        } else {
          bad(cname + ".chat_template", "expected a string or a list of {name, template}");
        }
      }
    } else if (t.prefix_.size() == 1) {
      t.bos_ = t.prefix_[0];  // no config: the post-processor's one leading token
    }
    if (tmpl.empty())
      t.chat_error_ = fmt::format(
          "tokenizer: {} has no chat template (tokenizer_config.json's "
          "chat_template or chat_template.jinja)",
          name);
    else
      t.set_chat_template(tmpl, name);
  }
};

Tokenizer Tokenizer::from_tokenizer_json_text(std::string_view tokenizer_json,
                                              std::string_view tokenizer_config,
                                              const std::string& name,
                                              std::string_view chat_template_jinja) {
  auto parse = [&](std::string_view text, const std::string& what) {
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      // Parse again for the position (nlohmann reports it only through the exception).
      try {
        const json unused = json::parse(text);
        (void)unused;
      } catch (const json::exception& e) {
        fail("tokenizer: {}: not valid JSON: {}", what, e.what());
      }
      fail("tokenizer: {}: not valid JSON", what);
    }
    return j;
  };
  const json j = parse(tokenizer_json, name);
  json config;
  const bool has_config = !tokenizer_config.empty();
  if (has_config) config = parse(tokenizer_config, name + " (its tokenizer_config.json)");
  Tokenizer t;
  JsonLoader loader(name, t);
  try {
    loader.load(j, has_config ? &config : nullptr, chat_template_jinja);
  } catch (const json::exception& e) {  // a value of the wrong type that the checks missed
    fail("tokenizer: {}: {}", name, e.what());
  }
  t.finish(std::move(loader.pipe));
  return t;
}

Tokenizer Tokenizer::from_tokenizer_json(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path file = path;
  if (fs::is_directory(file, ec)) file /= "tokenizer.json";
  const std::string text = read_file(file.string());
  const fs::path dir = file.parent_path();
  auto optional = [&](const char* leaf) {
    const fs::path p = dir / leaf;
    return fs::is_regular_file(p, ec) ? read_file(p.string()) : std::string();
  };
  const std::string config = optional("tokenizer_config.json");
  const std::string jinja = optional("chat_template.jinja");
  return from_tokenizer_json_text(text, config, file.string(), jinja);
}

}  // namespace kvq
