// Internals shared by the tokenizer's engine (tokenizer.cpp) and its tokenizer.json reader
// (tokenizer_json.cpp); not installed, not part of the API.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/tokenizer.h"

namespace kvq::tok {

/// \brief GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the other 68
/// bytes (controls, space, DEL, NBSP, soft hyphen) for code points 256, 257, ... in byte order.
const std::array<uint32_t, 256>& byte_to_codepoint();
/// \brief Decodes one UTF-8 code point at s[i], advancing i; -1 (i unchanged) for malformed input.
int64_t next_codepoint(std::string_view s, size_t& i);
/// \brief Appends the UTF-8 encoding of `cp`.
void append_utf8(std::string& out, uint32_t cp);
/// \brief Raw bytes of a string in byte-to-unicode form; false if it is not one.
bool unmap_bytes(std::string_view text, std::string& out);
/// \brief `s` with every `from` replaced by `to` (left to right, not overlapping; `s` for empty
/// `from`), as `tokenizers`' Replace normalizer and decoder with a String pattern.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to);
/// \brief `s` in byte-to-unicode form.
std::string map_bytes(std::string_view s);
/// \brief Unicode White_Space (Rust's char::is_whitespace, which `tokenizers` uses).
bool is_white_space(uint32_t cp);
/// \brief Unicode NFC of `s` (tokenizer_nfc.cpp); invalid UTF-8 bytes pass through unchanged.
std::string nfc(std::string_view s);

/// \brief An owned compiled PCRE2 pattern (UTF, UCP, MATCH_INVALID_UTF; JIT when available).
class Regex {
 public:
  Regex() = default;
  /// \brief Compiles `pattern`; throws kvq::Error "tokenizer: {where}: ..." when PCRE2 refuses.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex() { pcre2_code_free(code_); }
  Regex(Regex&& o) noexcept
      : code_(std::exchange(o.code_, nullptr)), pattern_(std::move(o.pattern_)) {}
  Regex& operator=(Regex&& o) noexcept {
    std::swap(code_, o.code_);
    std::swap(pattern_, o.pattern_);
    return *this;
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  const pcre2_code* code() const { return code_; }
  const std::string& pattern() const { return pattern_; }

 private:
  pcre2_code* code_ = nullptr;
  std::string pattern_;
};

/// \brief PCRE2's message for an error code.
std::string pcre2_message(int code);

// The GPT-2 regex of `tokenizers`' ByteLevel(use_regex=true), and SmolLM2's Digits step.
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr const char* kDigitPattern = R"(\p{N})";

}  // namespace kvq::tok

namespace kvq {

// The normalizer and pre-tokenizer, as `tokenizers` applies them (tokenizer.cpp).
struct Tokenizer::Pipeline {
  enum class Norm { kPrepend, kReplace, kNfc };
  struct NormStep {
    Norm kind;
    std::string a, b;  // Prepend: a; Replace: a -> b
  };
  // SplitDelimiterBehavior of `tokenizers`.
  enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };
  enum class Pre {
    kSplit,        // Split, Digits, ByteLevel's regex
    kPrefixSpace,  // ByteLevel(add_prefix_space): " " before a piece that does not start so
    kMetaspace,    // Metaspace: " " -> replacement, prepend by scheme, then split (re) if set
  };
  enum class Prepend { kNever, kFirst, kAlways };
  struct PreStep {
    Pre kind = Pre::kSplit;
    tok::Regex re;
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    std::string replacement;  // Metaspace
    Prepend prepend = Prepend::kAlways;
    bool split = false;
  };
  std::vector<NormStep> norm;
  std::vector<PreStep> pre;
  tok::Regex word_char;  // single_word added tokens: a character that continues a word
  // Added tokens by the first byte of their text (indexes into added_raw_ / added_norm_).
  std::array<std::vector<uint32_t>, 256> raw_by_byte, norm_by_byte;
  // Whether every raw / normalized added token is special (then without parse_special none is
  // matched and the scan is skipped).
  bool raw_all_special = true, norm_all_special = true;
};

}  // namespace kvq
