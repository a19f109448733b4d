// Byte-level BPE for SmolLM2 (see tokenizer.h).
//
// Pre-tokenization ("smollm" in llama.cpp; in SmolLM2's tokenizer.json a Sequence of
// Digits(individual_digits=true) and ByteLevel(add_prefix_space=false, use_regex=true)), in two
// stages, as the Sequence applies them:
//   1. every Unicode number character is a piece of its own:   \p{N}
//   2. the text between them is split by GPT-2's regex:
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (llama.cpp lists the same two regexes for "smollm", without the final |\s+, and emits the
//      unmatched text itself, which comes to the same pieces).
// The stages cannot be fused into one alternation: stage 2 sees the end of its span at a digit,
// so "a  1" gives "a", "  ", "1" (\s+(?!\S) takes both spaces) where one regex would give
// "a", " ", " ", "1". PCRE2 runs both with UTF + UCP (Unicode \p{L}, \p{N}, \s) and
// MATCH_INVALID_UTF: bytes of invalid UTF-8 match no pattern item, so every gap between matches
// (only ever invalid UTF-8) becomes a piece of its own and byte-level BPE encodes it like any
// other bytes.
//
// SmolLM2's vocabulary has no token for 21 bytes (0x04 0x06 0x13 0x14 0x16 0x1d 0xc0 0xc1 0xf1
// 0xf2 0xf5-0xff): like `tokenizers` (BPE without an unknown token) and llama.cpp, encode drops
// them, so decode(encode(s)) is s without those bytes.
//
// BPE: each piece starts as single-byte tokens; the adjacent pair of lowest merge rank merges
// first, equal ranks leftmost first (a min-heap over (rank, position) with stale entries skipped),
// which is what the `tokenizers` library does.
#include "model/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <functional>

#include "core/error.h"

namespace kvq {
namespace {

constexpr const char* kDigitPattern = R"(\p{N})";
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// llama.cpp's token types (tokenizer.ggml.token_type).
constexpr int32_t kTypeControl = 3;
constexpr int32_t kTypeUserDefined = 4;

// Pieces up to this many bytes are remembered within one encode call (words repeat a lot).
constexpr size_t kCacheMaxPiece = 64;

// SmolLM2's chat template (tokenizer.chat_template), as fragments of its Jinja source.
constexpr const char* kDefaultSystem =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
constexpr const char* kTemplateFragments[] = {
    "loop.first and messages[0]['role'] != 'system'",
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n'",
    "'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'",
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}",
};

// GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the other 68 bytes
// (controls, space, DEL, NBSP, soft hyphen) for code points 256, 257, ... in byte order.
std::array<uint32_t, 256> byte_to_codepoint() {
  std::array<uint32_t, 256> cp{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    cp[b] = printable ? b : next++;
  }
  return cp;
}

// Decodes one UTF-8 code point at s[i], advancing i; -1 for malformed input.
int64_t next_codepoint(std::string_view s, size_t& i) {
  const auto c0 = static_cast<uint8_t>(s[i]);
  int len = c0 < 0x80 ? 1 : (c0 >> 5) == 6 ? 2 : (c0 >> 4) == 14 ? 3 : (c0 >> 3) == 30 ? 4 : 0;
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

// Raw bytes of a vocabulary string in byte-to-unicode form; false if it is not one.
bool unmap_bytes(std::string_view text, std::string& out) {
  static const auto inverse = [] {
    std::array<int16_t, 512> inv;
    inv.fill(-1);
    const auto fwd = byte_to_codepoint();
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

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

size_t invalid_utf8_at(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    if (next_codepoint(s, i) < 0) return at;
  }
  return std::string_view::npos;
}

struct Tokenizer::Regexes {
  pcre2_code* digit = nullptr;
  pcre2_code* gpt2 = nullptr;

  Regexes() {
    digit = compile(kDigitPattern);
    gpt2 = compile(kGpt2Pattern);
  }
  ~Regexes() {
    pcre2_code_free(digit);
    pcre2_code_free(gpt2);
  }
  Regexes(const Regexes&) = delete;
  Regexes& operator=(const Regexes&) = delete;

  static pcre2_code* compile(const char* pattern) {
    int err = 0;
    PCRE2_SIZE at = 0;
    pcre2_code* re =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, nullptr);
    if (re == nullptr)
      fail("tokenizer: PCRE2 rejects /{}/ at {}: {}", pattern, at, pcre2_message(err));
    // JIT is an optimization only: without it (unsupported platform) pcre2_match interprets.
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
  }
};

struct Tokenizer::EncodeState {
  std::vector<int32_t>& out;
  pcre2_match_data* md;
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache;  // -> span of pool
  std::vector<int32_t> pool;
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

  explicit EncodeState(std::vector<int32_t>& o) : out(o), md(pcre2_match_data_create(1, nullptr)) {
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
    if (rc < 0) fail("tokenizer: PCRE2 match failed at byte {}: {}", from, pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    return {ov[0], ov[1]};
  }
};

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
  std::unordered_map<std::string_view, int32_t> by_text;
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    by_text.emplace(t.text_[i], id);
    if (types[i] == kTypeControl || types[i] == kTypeUserDefined) {
      t.special_[i] = 1;
      t.bytes_[i] = t.text_[i];  // special tokens are stored as plain text
      if (!t.bytes_[i].empty()) t.specials_by_length_.push_back(id);
    } else if (!unmap_bytes(t.text_[i], t.bytes_[i])) {
      fail("tokenizer: {} token {} ('{}') is not in GPT-2 byte-to-unicode form", f.name(), i,
           t.text_[i]);
    } else if (t.bytes_[i].size() == 1) {
      auto& slot = t.byte_token_[static_cast<uint8_t>(t.bytes_[i][0])];
      if (slot < 0) slot = id;
    }
  }
  std::stable_sort(t.specials_by_length_.begin(), t.specials_by_length_.end(),
                   [&](int32_t a, int32_t b) { return t.bytes_[a].size() > t.bytes_[b].size(); });

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

  if (!f.has("tokenizer.chat_template")) {
    t.chat_error_ = fmt::format("tokenizer: {} has no tokenizer.chat_template", f.name());
  } else {
    const std::string tmpl = f.get_string("tokenizer.chat_template");
    t.chatml_ = std::all_of(std::begin(kTemplateFragments), std::end(kTemplateFragments),
                            [&](const char* frag) { return tmpl.find(frag) != std::string::npos; });
    if (!t.chatml_)
      t.chat_error_ = fmt::format(
          "tokenizer: the chat template of {} is not SmolLM2's ChatML template", f.name());
  }

  t.re_ = std::make_shared<const Regexes>();
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
  if (n <= 0) return encode(text);
  for (size_t bytes = static_cast<size_t>(n) * 6 + 1024;; bytes *= 2) {
    if (bytes >= text.size()) {
      auto ids = encode(text);
      if (static_cast<int64_t>(ids.size()) > n) ids.resize(static_cast<size_t>(n));
      return ids;
    }
    const size_t cut = text.rfind('\n', bytes);
    if (cut == std::string_view::npos || cut == 0) continue;
    auto ids = encode(text.substr(0, cut + 1));
    if (static_cast<int64_t>(ids.size()) >= n) {
      ids.resize(static_cast<size_t>(n));
      return ids;
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  EncodeState st(out);
  if (!parse_special) {
    encode_text(text, st);
    return out;
  }
  // Leftmost special token, longest at that position; the text between goes through BPE.
  size_t done = 0;
  for (size_t pos = 0; pos < text.size();) {
    int32_t hit = -1;
    for (int32_t id : specials_by_length_) {
      if (text.substr(pos).starts_with(bytes_[static_cast<size_t>(id)])) {
        hit = id;
        break;
      }
    }
    if (hit < 0) {
      ++pos;
      continue;
    }
    encode_text(text.substr(done, pos - done), st);
    out.push_back(hit);
    pos += bytes_[static_cast<size_t>(hit)].size();
    done = pos;
  }
  encode_text(text.substr(done), st);
  return out;
}

void Tokenizer::encode_text(std::string_view text, EncodeState& st) const {
  // Stage 1: each \p{N} character alone; stage 2 on the spans between.
  size_t pos = 0;
  while (pos < text.size()) {
    auto [ds, de] = st.find(re_->digit, text, pos);
    if (ds == std::string_view::npos) ds = de = text.size();
    if (ds > pos) encode_segment(text.substr(pos, ds - pos), st);
    if (de > ds) encode_piece(text.substr(ds, de - ds), st);
    pos = de;
  }
}

void Tokenizer::encode_segment(std::string_view seg, EncodeState& st) const {
  size_t pos = 0;
  while (pos < seg.size()) {
    auto [s, e] = st.find(re_->gpt2, seg, pos);
    if (s == std::string_view::npos) s = e = seg.size();
    if (s > pos) encode_piece(seg.substr(pos, s - pos), st);  // invalid UTF-8
    if (e > s) encode_piece(seg.substr(s, e - s), st);
    pos = e;
  }
}

void Tokenizer::encode_piece(std::string_view piece, EncodeState& st) const {
  if (piece.size() == 1) {
    if (const int32_t id = byte_token_[static_cast<uint8_t>(piece[0])]; id >= 0)
      st.out.push_back(id);
    return;
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
  st.cache.emplace(piece, std::pair{off, static_cast<uint32_t>(st.out.size() - before)});
}

const Tokenizer::Merge* Tokenizer::find_merge(int32_t left, int32_t right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void Tokenizer::bpe(std::string_view piece, EncodeState& st) const {
  using Cand = EncodeState::Cand;
  auto& syms = st.syms;
  auto& heap = st.heap;
  syms.clear();
  heap.clear();
  for (char ch : piece) {
    // Bytes without a token are left out and their neighbours may merge, as in `tokenizers`.
    const int32_t id = byte_token_[static_cast<uint8_t>(ch)];
    const auto i = static_cast<int32_t>(syms.size());
    if (id >= 0) syms.push_back({id, i - 1, i + 1});
  }
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

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string s;
  for (int32_t id : ids) s += token_bytes(id);
  return s;
}

std::string Tokenizer::chat(const std::vector<std::pair<std::string, std::string>>& messages,
                            bool add_generation_prompt) const {
  if (!chatml_) fail("{}", chat_error_);
  std::string s;
  if (!messages.empty() && messages.front().first != "system")
    s += std::string("<|im_start|>system\n") + kDefaultSystem + "<|im_end|>\n";
  for (const auto& [role, content] : messages)
    s += "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
  if (add_generation_prompt) s += "<|im_start|>assistant\n";
  return s;
}

}  // namespace kvq
