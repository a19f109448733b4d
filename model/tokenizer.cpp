// The BPE engine (see tokenizer.h) and its GGUF source.
//
// encode(text) runs `tokenizers`' pipeline (tokenizer.rs: extract_and_normalize, pre_tokenize,
// do_tokenize, post_process):
//   1. added tokens whose "normalized" is false (every GGUF special) are found in the raw text,
//      leftmost then longest (aho-corasick LeftmostLongest), lstrip/rstrip taking the whitespace
//      beside them and single_word requiring no word character beside them; a special token is
//      skipped (left as text) without parse_special;
//   2. each stretch between them is normalized on its own (Prepend, Replace, NFC), and the
//      "normalized": true added tokens are found in that;
//   3. each remaining stretch goes through the pre-tokenizer steps in order, each splitting every
//      piece of the previous one (Split with the file's regex and delimiter behaviour, Digits,
//      ByteLevel's GPT-2 regex and add_prefix_space, Metaspace's replacement/prepend/split);
//      "at origin" (Metaspace prepend_scheme "first") is a piece starting at byte 0 of the input;
//   4. each piece goes through BPE: byte-level models start from one token per byte (GPT-2's
//      byte-to-unicode form), the others from one token per character, then byte-fallback tokens
//      <0xNN>, then unk (fused when fuse_unk); ignore_merges takes a piece that is a vocabulary
//      entry as is; then the adjacent pair of lowest merge rank merges first, equal ranks leftmost
//      first (a min-heap over (rank, position) with stale entries skipped), as `tokenizers` does;
//   5. with add_special, the post-processor's tokens go around the ids.
// Regexes run in PCRE2 with UTF + UCP (Unicode \p{L}, \p{N}, \s) and MATCH_INVALID_UTF: bytes of
// invalid UTF-8 match no pattern item, so every gap between matches (only ever invalid UTF-8
// under the GPT-2-style patterns) becomes a piece of its own and byte-level BPE encodes it like
// any other bytes.
//
// SmolLM2's GGUF ("smollm" in llama.cpp; in SmolLM2's tokenizer.json a Sequence of
// Digits(individual_digits=true) and ByteLevel(add_prefix_space=false, use_regex=true)) is two
// Split steps: \p{N} alone, then GPT-2's regex
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// on the text between (llama.cpp lists the same two regexes for "smollm", without the final |\s+,
// and emits the unmatched text itself, which comes to the same pieces). The steps cannot be fused
// into one alternation: the second sees the end of its span at a digit, so "a  1" gives "a",
// "  ", "1" (\s+(?!\S) takes both spaces) where one regex would give "a", " ", " ", "1".
// SmolLM2's vocabulary has no token for 21 bytes (0x04 0x06 0x13 0x14 0x16 0x1d 0xc0 0xc1 0xf1
// 0xf2 0xf5-0xff): like `tokenizers` (BPE without an unknown token) and llama.cpp, encode drops
// them, so decode(encode(s)) is s without those bytes.
#include "model/tokenizer.h"

#include <algorithm>
#include <array>
#include <functional>

#include "core/error.h"
#include "model/tokenizer_internal.h"

namespace kvq {
namespace tok {

const std::array<uint32_t, 256>& byte_to_codepoint() {
  static const auto table = [] {
    std::array<uint32_t, 256> cp{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      cp[b] = printable ? b : next++;
    }
    return cp;
  }();
  return table;
}

int64_t next_codepoint(std::string_view s, size_t& i) {
  const auto c0 = static_cast<uint8_t>(s[i]);
  const int len = c0 < 0x80         ? 1
                  : (c0 >> 5) == 6  ? 2
                  : (c0 >> 4) == 14 ? 3
                  : (c0 >> 3) == 30 ? 4
                                    : 0;
  if (len == 0 || i + len > s.size()) return -1;
  uint32_t cp = len == 1 ? c0 : c0 & (0x7F >> len);
  for (int k = 1; k < len; ++k) {
    const auto c = static_cast<uint8_t>(s[i + k]);
    if ((c >> 6) != 2) return -1;
    cp = (cp << 6) | (c & 0x3F);
  }
  i += len;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool unmap_bytes(std::string_view text, std::string& out) {
  static const auto inverse = [] {
    std::array<int16_t, 512> inv;
    inv.fill(-1);
    const auto& fwd = byte_to_codepoint();
    for (int b = 0; b < 256; ++b) inv[fwd[b]] = static_cast<int16_t>(b);
    return inv;
  }();
  out.clear();
  for (size_t i = 0; i < text.size();) {
    const int64_t cp = next_codepoint(text, i);
    if (cp < 0 || cp >= static_cast<int64_t>(inverse.size()) || inverse[cp] < 0) return false;
    out.push_back(static_cast<char>(inverse[cp]));
  }
  return true;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(s);
  std::string r;
  r.reserve(s.size());
  for (size_t i = 0;;) {
    const size_t k = s.find(from, i);
    if (k == std::string_view::npos) return r.append(s.substr(i));
    r.append(s.substr(i, k - i)).append(to);
    i = k + from.size();
  }
}

std::string map_bytes(std::string_view s) {
  std::string out;
  out.reserve(s.size() * 2);
  for (char c : s) append_utf8(out, byte_to_codepoint()[static_cast<uint8_t>(c)]);
  return out;
}

bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}

Regex::Regex(const std::string& pattern, const std::string& where) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE at = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, nullptr);
  if (code_ == nullptr)
    fail("tokenizer: {}: PCRE2 rejects the regex /{}/ at offset {}: {}", where, pattern, at,
         pcre2_message(err));
  // JIT is an optimization only: without it (unsupported platform) pcre2_match interprets.
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

}  // namespace tok

namespace {

// llama.cpp's token types (tokenizer.ggml.token_type).
constexpr int32_t kTypeControl = 3;
constexpr int32_t kTypeUserDefined = 4;

// Pieces up to this many bytes are remembered within one encode call (words repeat a lot).
constexpr size_t kCacheMaxPiece = 64;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// The code point that ends s (-1 if none or invalid) and the one that starts it.
int64_t last_codepoint(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<uint8_t>(s[i - 1]) & 0xC0) == 0x80 && s.size() - i < 3) --i;
  if (i == 0) return -1;
  size_t at = i - 1;
  const int64_t cp = tok::next_codepoint(s, at);
  return at == s.size() ? cp : -1;
}
int64_t first_codepoint(std::string_view s) {
  size_t i = 0;
  return s.empty() ? -1 : tok::next_codepoint(s, i);
}

}  // namespace

size_t invalid_utf8_at(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    if (tok::next_codepoint(s, i) < 0) return at;
  }
  return std::string_view::npos;
}

struct Tokenizer::EncodeState {
  std::vector<int32_t>& out;
  pcre2_match_data* md;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>>
      cache;  // piece -> span of pool
  std::vector<int32_t> pool;
  // Per pre-tokenizer step: the transformed piece and the split ranges.
  struct Range {
    size_t start, end;
    bool match;
  };
  std::vector<std::string> bufs;
  std::vector<std::vector<Range>> ranges;
  std::string norm_buf, scratch;
  // BPE scratch.
  struct Sym {
    int32_t id, prev, next;
  };
  struct Cand {
    int32_t rank, pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Sym> syms;
  std::vector<Cand> heap;

  EncodeState(std::vector<int32_t>& o, size_t steps)
      : out(o), md(pcre2_match_data_create(1, nullptr)), bufs(steps), ranges(steps) {
    if (md == nullptr) fail("tokenizer: out of memory for PCRE2 match data");
  }
  ~EncodeState() { pcre2_match_data_free(md); }
  EncodeState(const EncodeState&) = delete;
  EncodeState& operator=(const EncodeState&) = delete;

  // The next match of `re` in `s` at or after `from`: {start, end}, or {npos, npos}.
  std::pair<size_t, size_t> find(const pcre2_code* re, std::string_view s, size_t from) {
    const int rc =
        pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), from, 0, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return {std::string_view::npos, std::string_view::npos};
    if (rc < 0) fail("tokenizer: PCRE2 match failed at byte {}: {}", from, tok::pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    return {ov[0], ov[1]};
  }
};

void Tokenizer::finish(std::shared_ptr<Pipeline> pipe) {
  const auto n = text_.size();
  auto by_length = [&](std::vector<Added>& list) {
    std::stable_sort(list.begin(), list.end(), [&](const Added& a, const Added& b) {
      return text_[static_cast<size_t>(a.id)].size() > text_[static_cast<size_t>(b.id)].size();
    });
  };
  by_length(added_raw_);
  by_length(added_norm_);
  for (size_t i = 0; i < added_raw_.size(); ++i)
    pipe->raw_by_byte[static_cast<uint8_t>(text_[static_cast<size_t>(added_raw_[i].id)][0])]
        .push_back(static_cast<uint32_t>(i));
  for (size_t i = 0; i < added_norm_.size(); ++i)
    pipe->norm_by_byte[static_cast<uint8_t>(text_[static_cast<size_t>(added_norm_[i].id)][0])]
        .push_back(static_cast<uint32_t>(i));
  for (const Added& a : added_raw_) pipe->raw_all_special = pipe->raw_all_special && a.special;
  for (const Added& a : added_norm_) pipe->norm_all_special = pipe->norm_all_special && a.special;
  // encode_first's cut after "\n" before [A-Za-z0-9] is exact when no token spans one.
  // Metaspace-style vocabularies (not byte-level): "▁" starts words and is never inside a token,
  // so encode_piece may cut a piece before each one (the SentencePiece families' long pieces).
  word_start_.clear();
  if (!byte_level_ && !ignore_merges_ && vocab_.contains("\u2581")) {
    bool inside = false;
    for (const auto& [text, id] : vocab_)
      inside = inside || text.find("\u2581", 1) != std::string::npos;
    if (!inside) word_start_ = "\u2581";
  }
  newline_cut_safe_ = true;
  for (size_t i = 0; i < n && newline_cut_safe_; ++i) {
    if (special_[i]) continue;
    const std::string& b = bytes_[i];
    for (size_t k = b.find('\n'); k != std::string::npos && k + 1 < b.size();
         k = b.find('\n', k + 1))
      if (std::isalnum(static_cast<unsigned char>(b[k + 1]))) newline_cut_safe_ = false;
  }
  pipe_ = std::move(pipe);
}

Tokenizer Tokenizer::from_gguf(const gguf::GgufFile& f) {
  Tokenizer t;
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2")
    fail("tokenizer: {} has tokenizer.ggml.model '{}'; only 'gpt2' (byte-level BPE) is supported",
         f.name(), model);
  t.pre_ = f.has("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "";
  if (t.pre_ != "smollm")
    fail("tokenizer: {} has tokenizer.ggml.pre '{}'; only 'smollm' is supported", f.name(), t.pre_);

  t.text_ = f.get_string_array("tokenizer.ggml.tokens");
  const auto n = t.text_.size();
  if (n == 0 || n > (1u << 30)) fail("tokenizer: {} has {} tokens", f.name(), n);
  std::vector<int32_t> types(n, 1);
  if (f.has("tokenizer.ggml.token_type")) types = f.get_i32_array("tokenizer.ggml.token_type");
  if (types.size() != n)
    fail("tokenizer: {} has {} token types for {} tokens", f.name(), types.size(), n);

  t.bytes_.resize(n);
  t.special_.assign(n, 0);
  std::fill(std::begin(t.byte_token_), std::end(t.byte_token_), -1);
  std::fill(std::begin(t.fallback_), std::end(t.fallback_), -1);
  std::unordered_map<std::string_view, int32_t> by_text;
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    by_text.emplace(t.text_[i], id);
    if (types[i] == kTypeControl || types[i] == kTypeUserDefined) {
      t.special_[i] = 1;
      t.bytes_[i] = t.text_[i];  // special tokens are stored as plain text
      if (!t.bytes_[i].empty()) t.added_raw_.push_back({id, true, false, false, false});
    } else if (!tok::unmap_bytes(t.text_[i], t.bytes_[i])) {
      fail("tokenizer: {} token {} ('{}') is not in GPT-2 byte-to-unicode form", f.name(), i,
           t.text_[i]);
    } else if (t.bytes_[i].size() == 1) {
      auto& slot = t.byte_token_[static_cast<uint8_t>(t.bytes_[i][0])];
      if (slot < 0) slot = id;
    }
  }

  const auto merges = f.get_string_array("tokenizer.ggml.merges");
  t.merges_.reserve(merges.size());
  std::string joined;
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string_view m = merges[r];
    const size_t sp = m.find(' ');
    if (sp == std::string_view::npos || m.find(' ', sp + 1) != std::string_view::npos)
      fail("tokenizer: {} merge {} ('{}') is not 'left right'", f.name(), r, m);
    joined.assign(m.substr(0, sp)).append(m.substr(sp + 1));
    const auto l = by_text.find(m.substr(0, sp)), rt = by_text.find(m.substr(sp + 1)),
               j = by_text.find(joined);
    if (l == by_text.end() || rt == by_text.end() || j == by_text.end())
      fail("tokenizer: {} merge {} ('{}') names a token not in the vocabulary", f.name(), r, m);
    t.merges_.emplace(pair_key(l->second, rt->second), Merge{static_cast<int32_t>(r), j->second});
  }

  auto id_of = [&](const char* key) -> int32_t {
    if (!f.has(key)) return -1;
    const int32_t id = f.get_i32(key);
    if (id < 0 || static_cast<size_t>(id) >= n)
      fail("tokenizer: {} {} = {} is outside the vocabulary of {}", f.name(), key, id, n);
    return id;
  };
  t.bos_ = id_of("tokenizer.ggml.bos_token_id");
  t.eos_ = id_of("tokenizer.ggml.eos_token_id");
  t.pad_ = id_of("tokenizer.ggml.padding_token_id");
  t.unk_ = id_of("tokenizer.ggml.unknown_token_id");
  auto flag = [&](const char* key) { return f.has(key) && f.get_bool(key); };
  if (flag("tokenizer.ggml.add_bos_token") && t.bos_ >= 0) t.prefix_.push_back(t.bos_);
  if (flag("tokenizer.ggml.add_eos_token") && t.eos_ >= 0) t.suffix_.push_back(t.eos_);

  if (f.has("tokenizer.chat_template"))
    t.set_chat_template(f.get_string("tokenizer.chat_template"), f.name());
  else
    t.chat_error_ = fmt::format("tokenizer: {} has no tokenizer.chat_template", f.name());

  auto pipe = std::make_shared<Pipeline>();
  pipe->pre.resize(2);
  pipe->pre[0].re = tok::Regex(tok::kDigitPattern, "Digits");
  pipe->pre[1].re = tok::Regex(tok::kGpt2Pattern, "ByteLevel");
  t.finish(std::move(pipe));
  return t;
}

std::string_view Tokenizer::token(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail("tokenizer: token id {} outside [0, {})", id, vocab_size());
  return text_[static_cast<size_t>(id)];
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail("tokenizer: token id {} outside [0, {})", id, vocab_size());
  return bytes_[static_cast<size_t>(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail("tokenizer: token id {} outside [0, {})", id, vocab_size());
  return special_[static_cast<size_t>(id)] != 0;
}

std::vector<int32_t> Tokenizer::encode_first(std::string_view text, int64_t n) const {
  if (n <= 0 || !newline_cut_safe_) {
    auto ids = encode(text);
    if (n > 0 && static_cast<int64_t>(ids.size()) > n) ids.resize(static_cast<size_t>(n));
    return ids;
  }
  for (size_t bytes = static_cast<size_t>(n) * 6 + 1024;; bytes *= 2) {
    if (bytes >= text.size()) {
      auto ids = encode(text);
      if (static_cast<int64_t>(ids.size()) > n) ids.resize(static_cast<size_t>(n));
      return ids;
    }
    size_t cut = text.rfind('\n', bytes);
    while (cut != std::string_view::npos && cut > 0 &&
           !std::isalnum(static_cast<unsigned char>(text[cut + 1])))
      cut = text.rfind('\n', cut - 1);
    if (cut == std::string_view::npos || cut == 0) continue;
    auto ids = encode(text.substr(0, cut + 1));
    if (static_cast<int64_t>(ids.size()) >= n) {
      ids.resize(static_cast<size_t>(n));
      return ids;
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special,
                                       bool add_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1 + prefix_.size() + suffix_.size());
  if (add_special) out = prefix_;
  EncodeState st(out, pipe_->pre.size());
  encode_with_added(text, parse_special, st);
  if (add_special) out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

namespace {

// `tokenizers`' AddedVocabulary::find_matches over one list: calls emit(start, stop, index) for
// each accepted match, leftmost then longest, with lstrip/rstrip/single_word applied, and
// text(start, stop) for each stretch between them.
template <typename Added, typename Bucket, typename Text, typename Emit, typename Skip>
void find_added(std::string_view s, const std::vector<Added>& list, const Bucket& by_byte,
                const std::vector<std::string>& token_text, Skip&& skip, const tok::Regex& word,
                pcre2_match_data* md, Text&& text, Emit&& emit) {
  auto is_word = [&](int64_t cp) {
    if (cp < 0 || word.code() == nullptr) return false;
    std::string one;
    tok::append_utf8(one, static_cast<uint32_t>(cp));
    return pcre2_match(word.code(), reinterpret_cast<PCRE2_SPTR>(one.data()), one.size(), 0,
                       PCRE2_ANCHORED, md, nullptr) >= 0;
  };
  size_t done = 0;
  for (size_t pos = 0; pos < s.size();) {
    const auto& bucket = by_byte[static_cast<uint8_t>(s[pos])];
    const Added* hit = nullptr;
    uint32_t hit_index = 0;
    for (uint32_t k : bucket) {
      if (s.substr(pos).starts_with(token_text[static_cast<size_t>(list[k].id)])) {
        hit = &list[k];
        hit_index = k;
        break;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + token_text[static_cast<size_t>(hit->id)].size();
    pos = stop;  // matches never overlap, even skipped ones
    if (skip(*hit)) continue;
    if (hit->single_word &&
        (is_word(last_codepoint(s.substr(0, start))) || is_word(first_codepoint(s.substr(stop)))))
      continue;
    if (hit->lstrip) {  // the whitespace before it, not reaching into the previous match
      size_t ns = start;
      for (int64_t cp; ns > 0 && (cp = last_codepoint(s.substr(0, ns))) >= 0 &&
                       tok::is_white_space(static_cast<uint32_t>(cp));)
        ns -= cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
      start = std::max(ns, done);
    }
    if (hit->rstrip) {
      while (stop < s.size()) {
        size_t i = stop;
        const int64_t cp = tok::next_codepoint(s, i);
        if (cp < 0 || !tok::is_white_space(static_cast<uint32_t>(cp))) break;
        stop = i;
      }
      pos = stop;
    }
    if (start > done) text(done, start);
    emit(hit_index, start, stop);
    done = stop;
  }
  if (done < s.size()) text(done, s.size());
}

}  // namespace

void Tokenizer::encode_with_added(std::string_view text, bool parse_special,
                                  EncodeState& st) const {
  if (added_raw_.empty() || (!parse_special && pipe_->raw_all_special)) {
    encode_normalized(text, true, parse_special, st);
    return;
  }
  find_added(
      text, added_raw_, pipe_->raw_by_byte, text_,
      [&](const Added& a) { return a.special && !parse_special; }, pipe_->word_char, st.md,
      [&](size_t a, size_t b) {
        encode_normalized(text.substr(a, b - a), a == 0, parse_special, st);
      },
      [&](uint32_t k, size_t, size_t) { st.out.push_back(added_raw_[k].id); });
}

void Tokenizer::encode_normalized(std::string_view seg, bool at_origin, bool parse_special,
                                  EncodeState& st) const {
  if (seg.empty()) return;
  std::string_view s = seg;
  if (!pipe_->norm.empty()) {
    std::string& buf = st.norm_buf;
    buf.assign(seg);
    for (const auto& step : pipe_->norm) {
      switch (step.kind) {
        case Pipeline::Norm::kPrepend:
          if (!buf.empty()) buf.insert(0, step.a);
          break;
        case Pipeline::Norm::kReplace:
          buf = tok::replace_all(buf, step.a, step.b);
          break;
        case Pipeline::Norm::kNfc:
          buf = tok::nfc(buf);
          break;
      }
    }
    s = buf;
  }
  if (added_norm_.empty() || (!parse_special && pipe_->norm_all_special)) {
    pre_tokenize(0, s, at_origin, st);
    return;
  }
  // norm_buf is not touched again below (pre_tokenize uses its own buffers).
  find_added(
      s, added_norm_, pipe_->norm_by_byte, text_,
      [&](const Added& a) { return a.special && !parse_special; }, pipe_->word_char, st.md,
      [&](size_t a, size_t b) { pre_tokenize(0, s.substr(a, b - a), at_origin && a == 0, st); },
      [&](uint32_t k, size_t, size_t) { st.out.push_back(added_norm_[k].id); });
}

void Tokenizer::pre_tokenize(size_t step, std::string_view piece, bool at_origin,
                             EncodeState& st) const {
  if (piece.empty()) return;
  if (step == pipe_->pre.size()) {
    encode_piece(piece, st);
    return;
  }
  using P = Pipeline;
  const P::PreStep& ps = pipe_->pre[step];
  std::string_view s = piece;
  if (ps.kind == P::Pre::kPrefixSpace) {
    if (piece.front() == ' ') {
      pre_tokenize(step + 1, piece, at_origin, st);
    } else {
      std::string& buf = st.bufs[step];
      buf.assign(" ").append(piece);
      pre_tokenize(step + 1, buf, at_origin, st);
    }
    return;
  }
  if (ps.kind == P::Pre::kMetaspace) {
    std::string& buf = st.bufs[step];
    buf.clear();
    for (char c : piece) {
      if (c == ' ')
        buf += ps.replacement;
      else
        buf.push_back(c);
    }
    const bool prepend =
        ps.prepend == P::Prepend::kAlways || (ps.prepend == P::Prepend::kFirst && at_origin);
    if (prepend && !buf.starts_with(ps.replacement)) buf.insert(0, ps.replacement);
    if (!ps.split) {
      pre_tokenize(step + 1, buf, at_origin, st);
      return;
    }
    s = buf;
  }
  if (ps.behavior == P::Behavior::kIsolated && !ps.invert) {
    // The common case (Split "Isolated", Digits, ByteLevel's regex): every match and every gap is
    // a piece, in order, with no list built.
    for (size_t pos = 0; pos < s.size();) {
      auto [ms, me] = st.find(ps.re.code(), s, pos);
      if (ms == std::string_view::npos) ms = me = s.size();
      if (me == ms && ms < s.size()) {  // an empty match splits nothing: one character on
        size_t i = ms;
        if (tok::next_codepoint(s, i) < 0) i = ms + 1;
        me = i;
      }
      if (ms > pos) pre_tokenize(step + 1, s.substr(pos, ms - pos), at_origin && pos == 0, st);
      if (me > ms) pre_tokenize(step + 1, s.substr(ms, me - ms), at_origin && ms == 0, st);
      pos = me;
    }
    return;
  }
  split_pieces(step, s, at_origin, st);
}

void Tokenizer::split_pieces(size_t step, std::string_view s, bool at_origin,
                             EncodeState& st) const {
  using P = Pipeline;
  const P::PreStep& ps = pipe_->pre[step];
  // Split s by ps.re: matches and the gaps between them, then the delimiter behaviour.
  auto& ranges = st.ranges[step];
  ranges.clear();
  for (size_t pos = 0; pos < s.size();) {
    auto [ms, me] = st.find(ps.re.code(), s, pos);
    if (ms == std::string_view::npos) break;
    if (me == ms) {  // an empty match splits nothing: look again one character on
      size_t i = ms;
      if (i >= s.size()) break;
      if (tok::next_codepoint(s, i) < 0) i = ms + 1;
      if (ms > pos) ranges.push_back({pos, ms, false});
      ranges.push_back({ms, i, false});
      pos = i;
      continue;
    }
    if (ms > pos) ranges.push_back({pos, ms, false});
    ranges.push_back({ms, me, true});
    pos = me;
  }
  if (ranges.empty() || ranges.back().end < s.size())
    ranges.push_back({ranges.empty() ? 0 : ranges.back().end, s.size(), false});
  if (ps.invert)
    for (auto& r : ranges) r.match = !r.match;
  using B = P::Behavior;
  switch (ps.behavior) {
    case B::kIsolated:
      break;
    case B::kRemoved:
      std::erase_if(ranges, [](const auto& r) { return r.match; });
      break;
    case B::kContiguous:
    case B::kMergedWithPrevious: {
      std::vector<EncodeState::Range> merged;
      bool previous = false;
      for (const auto& r : ranges) {
        const bool join =
            ps.behavior == B::kContiguous ? r.match == previous : r.match && !previous;
        if (join && !merged.empty())
          merged.back().end = r.end;
        else
          merged.push_back(r);
        previous = r.match;
      }
      ranges = std::move(merged);
      break;
    }
    case B::kMergedWithNext: {
      std::vector<EncodeState::Range> merged;
      bool previous = false;
      for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) {
        if (it->match && !previous && !merged.empty())
          merged.back().start = it->start;
        else
          merged.push_back(*it);
        previous = it->match;
      }
      std::reverse(merged.begin(), merged.end());
      ranges = std::move(merged);
      break;
    }
  }
  // Copy: the recursion below may reuse this step's vector (it does not: deeper steps have
  // their own), but `ranges` is a reference into st.
  for (size_t k = 0; k < st.ranges[step].size(); ++k) {
    const auto r = st.ranges[step][k];
    pre_tokenize(step + 1, s.substr(r.start, r.end - r.start), at_origin && r.start == 0, st);
  }
}

void Tokenizer::encode_piece(std::string_view piece, EncodeState& st) const {
  if (piece.size() == 1 && byte_level_ && !ignore_merges_) {
    if (const int32_t id = byte_token_[static_cast<uint8_t>(piece[0])]; id >= 0) {
      st.out.push_back(id);
      return;
    }
  }
  if (!word_start_.empty()) {
    // No token holds word_start_ ("▁") after its first character, so no merge crosses the
    // position before one: BPE on the piece is BPE on each stretch from one to the next.
    const size_t next = piece.find(word_start_, 1);
    if (next != std::string_view::npos) {
      for (size_t a = 0, b = next;; a = b, b = piece.find(word_start_, b + 1)) {
        encode_piece(piece.substr(a, b == std::string_view::npos ? b : b - a), st);
        if (b == std::string_view::npos) break;
      }
      return;
    }
  }
  if (piece.size() > kCacheMaxPiece) {
    bpe(piece, st);
    return;
  }
  if (auto it = st.cache.find(piece); it != st.cache.end()) {
    const auto [off, len] = it->second;
    st.out.insert(st.out.end(), st.pool.begin() + off, st.pool.begin() + off + len);
    return;
  }
  const size_t before = st.out.size();
  bpe(piece, st);
  const auto off = static_cast<uint32_t>(st.pool.size());
  st.pool.insert(st.pool.end(), st.out.begin() + static_cast<ptrdiff_t>(before), st.out.end());
  st.cache.emplace(std::string(piece),
                   std::pair{off, static_cast<uint32_t>(st.out.size() - before)});
}

const Tokenizer::Merge* Tokenizer::find_merge(int32_t left, int32_t right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void Tokenizer::bpe(std::string_view piece, EncodeState& st) const {
  using Cand = EncodeState::Cand;
  if (ignore_merges_) {
    const std::string& key =
        byte_level_ ? (st.scratch = tok::map_bytes(piece)) : st.scratch.assign(piece);
    if (const auto it = vocab_.find(key); it != vocab_.end()) {
      st.out.push_back(it->second);
      return;
    }
  }
  auto& syms = st.syms;
  auto& heap = st.heap;
  syms.clear();
  heap.clear();
  auto add = [&](int32_t id) {
    const auto i = static_cast<int32_t>(syms.size());
    syms.push_back({id, i - 1, i + 1});
  };
  // `tokenizers`' BPE::merge_word: a unit (a byte for byte-level models, else a character) with
  // no token falls back to its <0xNN> tokens, else to unk (fused when fuse_unk), else is dropped.
  // A pending unk is only flushed by a unit with a token (as `tokenizers` does).
  int32_t unk_pending = -1;
  auto unit = [&](int32_t id, std::string_view bytes) {
    if (id >= 0) {
      if (unk_pending >= 0) add(std::exchange(unk_pending, -1));
      add(id);
      return;
    }
    bool all = true;
    for (char b : bytes) all = all && fallback_[static_cast<uint8_t>(b)] >= 0;
    if (all && fallback_[static_cast<uint8_t>(bytes[0])] >= 0) {
      for (char b : bytes) add(fallback_[static_cast<uint8_t>(b)]);
      return;
    }
    if (model_unk_ < 0) return;
    if (unk_pending >= 0 && !fuse_unk_) add(unk_pending);
    unk_pending = model_unk_;
  };
  if (byte_level_) {
    for (char ch : piece) unit(byte_token_[static_cast<uint8_t>(ch)], std::string_view(&ch, 1));
  } else {
    for (size_t i = 0; i < piece.size();) {
      const size_t at = i;
      if (tok::next_codepoint(piece, i) < 0) i = at + 1;  // an invalid byte is a unit of its own
      const std::string_view u = piece.substr(at, i - at);
      st.scratch.assign(u);
      const auto it = vocab_.find(st.scratch);
      unit(it == vocab_.end() ? -1 : it->second, u);
    }
  }
  if (unk_pending >= 0) add(unk_pending);
  const auto n = static_cast<int32_t>(syms.size());
  if (n == 0) return;
  syms.back().next = -1;
  const auto cmp = std::greater<Cand>();
  auto push = [&](int32_t pos, int32_t left, int32_t right) {
    if (const Merge* m = find_merge(left, right)) {
      heap.push_back({m->rank, pos, left, right});
      std::push_heap(heap.begin(), heap.end(), cmp);
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i, syms[i].id, syms[i + 1].id);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const Cand c = heap.back();
    heap.pop_back();
    // Skip stale entries: a symbol only grows by merging, so equal ids mean the same pair.
    auto& l = syms[c.pos];
    if (l.id != c.left || l.next < 0 || syms[l.next].id != c.right) continue;
    const int32_t r = l.next;
    l.id = find_merge(c.left, c.right)->id;
    l.next = syms[r].next;
    if (l.next >= 0) syms[l.next].prev = c.pos;
    syms[r].id = -1;
    if (l.prev >= 0) push(l.prev, syms[l.prev].id, l.id);
    if (l.next >= 0) push(c.pos, l.id, syms[l.next].id);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) st.out.push_back(syms[i].id);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string s;
  bool first = true;
  for (int32_t id : ids) {
    std::string_view b = token_bytes(id);
    if (skip_special && special_[static_cast<size_t>(id)]) continue;
    if (first && strip_first_token_space_ && b.starts_with(' ')) b.remove_prefix(1);
    first = false;
    s += b;
  }
  if (strip_start_ > 0 || strip_stop_ > 0) {
    size_t a = 0, z = s.size();
    while (a < z && static_cast<int>(a) < strip_start_ && s[a] == ' ') ++a;
    for (int k = 0; k < strip_stop_ && z > a && s[z - 1] == ' '; ++k) --z;
    s = s.substr(a, z - a);
  }
  return s;
}

// ---- Chat templates -------------------------------------------------------------------------

namespace {

// SmolLM2's chat template (tokenizer.chat_template), as fragments of its Jinja source.
constexpr const char* kSmolFragments[] = {
    "loop.first and messages[0]['role'] != 'system'",
    "'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'",
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}",
};

bool has(const std::string& s, std::string_view frag) { return s.find(frag) != std::string::npos; }

// Python's str.strip() for the whitespace Jinja's |trim removes.
std::string trim(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const size_t a = s.find_first_not_of(ws);
  if (a == std::string_view::npos) return "";
  return std::string(s.substr(a, s.find_last_not_of(ws) - a + 1));
}

}  // namespace

void Tokenizer::set_chat_template(const std::string& tmpl, const std::string& name) {
  chat_ = ChatFormat::kNone;
  if (has(tmpl, "<|im_start|>") && has(tmpl, "<|im_end|>")) {
    chat_ = ChatFormat::kChatMl;
    // A default system message: '<|im_start|>system\n' followed by literal text up to
    // '<|im_end|>' within one string literal (the Jinja source spells the newline as \n).
    for (std::string_view open : {"<|im_start|>system\\n", "<|im_start|>system\n"}) {
      for (size_t at = tmpl.find(open); at != std::string::npos; at = tmpl.find(open, at + 1)) {
        const size_t from = at + open.size(), end = tmpl.find("<|im_end|>", from);
        if (end == std::string::npos) continue;
        const std::string_view body = std::string_view(tmpl).substr(from, end - from);
        if (body.empty() || body.find_first_of("'\"{}") != std::string_view::npos) continue;
        std::string msg;
        for (size_t i = 0; i < body.size(); ++i) {
          if (body[i] == '\\' && i + 1 < body.size() && body[i + 1] == 'n') {
            msg.push_back('\n');
            ++i;
          } else {
            msg.push_back(body[i]);
          }
        }
        chat_system_ = msg;
        break;
      }
      if (!chat_system_.empty()) break;
    }
    // SmolLM2's template states its rule; Qwen's check messages[0]['role'] == 'system'.
    if (!chat_system_.empty() && !has(tmpl, "messages[0]['role'] != 'system'") &&
        !has(tmpl, "messages[0]['role'] == 'system'") &&
        !has(tmpl, "messages[0].role == 'system'") &&
        !has(tmpl, "messages[0]['role'] == \"system\""))
      chat_ = ChatFormat::kNone;
    chat_think_ = has(tmpl, "reasoning_content") && has(tmpl, "<think>");
    if (chat_system_ == "You are a helpful AI assistant named SmolLM, trained by Hugging Face" &&
        !std::all_of(std::begin(kSmolFragments), std::end(kSmolFragments),
                     [&](const char* f) { return has(tmpl, f); }))
      chat_ = ChatFormat::kNone;
  } else if (has(tmpl, "<|start_header_id|>") && has(tmpl, "<|end_header_id|>") &&
             has(tmpl, "<|eot_id|>")) {
    chat_ = ChatFormat::kLlama3;
    chat_variant_ = has(tmpl, "Cutting Knowledge Date");
    if (chat_variant_ && has(tmpl, "strftime_now")) {
      chat_ = ChatFormat::kNone;
      chat_error_ = fmt::format(
          "tokenizer: the chat template of {} dates its system prelude with today's date "
          "(strftime_now); kvq renders Llama-3.0 and 3.1 templates only",
          name);
      return;
    }
  } else if (has(tmpl, "[INST]") && has(tmpl, "[/INST]")) {
    chat_ = has(tmpl, "<<SYS>>") ? ChatFormat::kLlama2 : ChatFormat::kMistral;
    // Mistral v0.1/v0.2 write ' [/INST]'; v0.3 writes '[/INST]', ' ' + answer|trim, and puts
    // the system message before the last user message.
    chat_variant_ = chat_ == ChatFormat::kMistral && !has(tmpl, " [/INST]");
  }
  if (chat_ == ChatFormat::kNone)
    chat_error_ = fmt::format(
        "tokenizer: the chat template of {} is none kvq renders (ChatML, Llama-3 headers, "
        "[INST])",
        name);
}

std::string Tokenizer::chat(const std::vector<std::pair<std::string, std::string>>& messages,
                            bool add_generation_prompt) const {
  auto text_of = [&](int32_t id) {
    return id >= 0 ? text_[static_cast<size_t>(id)] : std::string();
  };
  std::string s;
  switch (chat_) {
    case ChatFormat::kNone:
      fail("{}", chat_error_);
    case ChatFormat::kChatMl: {
      if (!messages.empty() && messages.front().first != "system" && !chat_system_.empty())
        s += "<|im_start|>system\n" + chat_system_ + "<|im_end|>\n";
      size_t last_user = std::string::npos;
      for (size_t i = 0; i < messages.size(); ++i)
        if (messages[i].first == "user") last_user = i;
      for (size_t i = 0; i < messages.size(); ++i) {
        const auto& [role, content] = messages[i];
        // Qwen3: the last assistant message after the last user turn gets an empty think block.
        if (chat_think_ && role == "assistant" && i + 1 == messages.size() &&
            (last_user == std::string::npos || i > last_user) &&
            content.find("</think>") == std::string::npos) {
          const size_t a = content.find_first_not_of('\n');
          s += "<|im_start|>assistant\n<think>\n\n</think>\n\n" +
               (a == std::string::npos ? std::string() : content.substr(a)) + "<|im_end|>\n";
          continue;
        }
        if (chat_think_ && role == "assistant" && content.find("</think>") != std::string::npos)
          fail("tokenizer: chat: an assistant message with a </think> block is not rendered");
        s += "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
      }
      if (add_generation_prompt) s += "<|im_start|>assistant\n";
      return s;
    }
    case ChatFormat::kLlama3: {
      s = text_of(bos_);
      size_t first = 0;
      if (chat_variant_) {
        std::string system;
        if (!messages.empty() && messages[0].first == "system") {
          system = trim(messages[0].second);
          first = 1;
        }
        s += "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December "
             "2023\nToday Date: 26 Jul 2024\n\n" +
             system + "<|eot_id|>";
      }
      for (size_t i = first; i < messages.size(); ++i)
        s += "<|start_header_id|>" + messages[i].first + "<|end_header_id|>\n\n" +
             trim(messages[i].second) + "<|eot_id|>";
      if (add_generation_prompt) s += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return s;
    }
    case ChatFormat::kLlama2:
    case ChatFormat::kMistral: {
      size_t first = 0;
      std::string system;
      const bool llama2 = chat_ == ChatFormat::kLlama2, v3 = chat_variant_;
      if (!messages.empty() && messages[0].first == "system") {
        if (!llama2 && !v3) fail("tokenizer: chat: this [INST] template has no system role");
        system = messages[0].second;
        first = 1;
      }
      if (!llama2) s = text_of(bos_);
      for (size_t i = first; i < messages.size(); ++i) {
        const auto& [role, content] = messages[i];
        if ((role == "user") != ((i - first) % 2 == 0))
          fail("tokenizer: chat: conversation roles must alternate user/assistant/user/...");
        if (role == "user" && llama2) {
          std::string c = content;
          if (i == first && first == 1) c = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
          s += text_of(bos_) + "[INST] " + trim(c) + " [/INST]";
        } else if (role == "user" && v3) {
          const bool sys = first == 1 && i + 1 == messages.size();
          s += "[INST] " + (sys ? system + "\n\n" : std::string()) + content + "[/INST]";
        } else if (role == "user") {
          s += "[INST] " + content + " [/INST]";
        } else if (role == "assistant") {
          s += llama2 ? " " + trim(content) + " " + text_of(eos_)
               : v3   ? " " + trim(content) + text_of(eos_)
                      : content + text_of(eos_);
        } else {
          fail("tokenizer: chat: the [INST] template has no role '{}'", role);
        }
      }
      (void)add_generation_prompt;  // [INST] templates end the user turn with [/INST] already
      return s;
    }
  }
  return s;
}

}  // namespace kvq
