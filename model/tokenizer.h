// Byte-level BPE tokenizer (GPT-2 style) for SmolLM2, built from the GGUF's own vocabulary:
// tokenizer.ggml.tokens (in GPT-2's byte-to-unicode form), tokenizer.ggml.merges ("a b", in rank
// order), tokenizer.ggml.token_type and the special token ids. Only the "smollm" pre-tokenizer
// (llama.cpp's name for SmolLM2's) is supported; see tokenizer.cpp for its regexes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/gguf.h"

namespace kvq {

/// \brief Offset of the first byte of `s` that does not start a well-formed UTF-8 sequence, or
/// npos when all of it is UTF-8 (the tokenizer's own decoding rule).
size_t invalid_utf8_at(std::string_view s);

/// \brief SmolLM2's tokenizer. Immutable after construction; encode/decode are thread-safe.
/// Any byte string encodes (invalid UTF-8 included) and decode(encode(s)) == s, except that bytes
/// with no token of their own (see encodable) are dropped, as `tokenizers` and llama.cpp do.
class Tokenizer {
 public:
  /// \brief Builds the tokenizer from a GGUF's tokenizer.* metadata. Throws kvq::Error for a
  /// model other than "gpt2", a pre-tokenizer other than "smollm", or inconsistent vocab/merges.
  static Tokenizer from_gguf(const gguf::GgufFile& f);

  /// \brief Token ids of `text`. With `parse_special`, the text of special (CONTROL) tokens such
  /// as "<|im_start|>" becomes that token (leftmost, then longest match); otherwise it is
  /// tokenized as ordinary text. No BOS is added (SmolLM2's add_bos_token is false).
  std::vector<int32_t> encode(std::string_view text, bool parse_special = false) const;
  /// \brief The first `n` tokens of encode(text) (all of them for n <= 0) without encoding the
  /// whole text: a prefix cut after a newline (no token spans one) is encoded, growing until it
  /// yields n tokens.
  std::vector<int32_t> encode_first(std::string_view text, int64_t n) const;

  /// \brief The bytes of `ids` concatenated (special tokens as their text). Throws kvq::Error
  /// for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids) const;

  /// \brief Renders SmolLM2's ChatML template (tokenizer.chat_template) for (role, content)
  /// messages: a default system message first unless messages[0] is one, then
  /// "<|im_start|>role\ncontent<|im_end|>\n" per message, then "<|im_start|>assistant\n" if
  /// `add_generation_prompt`. Throws kvq::Error if the GGUF's template is not that template.
  std::string chat(const std::vector<std::pair<std::string, std::string>>& messages,
                   bool add_generation_prompt = true) const;

  int32_t bos() const { return bos_; }  ///< -1 when the GGUF names none
  int32_t eos() const { return eos_; }
  int32_t pad() const { return pad_; }
  int32_t unk() const { return unk_; }
  int32_t vocab_size() const { return static_cast<int32_t>(text_.size()); }
  /// \brief The token as stored in the vocabulary (byte-to-unicode form, e.g. "Ġthe").
  std::string_view token(int32_t id) const;
  /// \brief The raw bytes the token stands for (" the").
  std::string_view token_bytes(int32_t id) const;
  /// \brief True for CONTROL / USER_DEFINED tokens, matched only by encode(..., true).
  bool is_special(int32_t id) const;
  /// \brief False for a byte that has no single-byte token (SmolLM2 lacks 21, e.g. 0x04, 0xff);
  /// encode drops such bytes.
  bool encodable(uint8_t byte) const { return byte_token_[byte] >= 0; }
  /// \brief tokenizer.ggml.pre ("smollm").
  const std::string& pre_tokenizer() const { return pre_; }

 private:
  struct Regexes;      // compiled PCRE2 patterns, shared by copies
  struct EncodeState;  // per-call scratch: match data, piece cache, BPE buffers
  struct Merge {
    int32_t rank;
    int32_t id;  // the merged token
  };

  Tokenizer() = default;
  void encode_text(std::string_view text, EncodeState& st) const;
  void encode_segment(std::string_view seg, EncodeState& st) const;
  void encode_piece(std::string_view piece, EncodeState& st) const;
  void bpe(std::string_view piece, EncodeState& st) const;
  const Merge* find_merge(int32_t left, int32_t right) const;

  std::shared_ptr<const Regexes> re_;
  std::string pre_;
  std::vector<std::string> text_;               // vocabulary strings as stored
  std::vector<std::string> bytes_;              // raw bytes of each token
  std::vector<uint8_t> special_;                // 1 for CONTROL / USER_DEFINED
  std::vector<int32_t> specials_by_length_;     // special ids, longest text first
  int32_t byte_token_[256] = {};                // id of each single-byte token, -1 if none
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  int32_t bos_ = -1, eos_ = -1, pad_ = -1, unk_ = -1;
  bool chatml_ = false;  // tokenizer.chat_template is SmolLM2's ChatML template
  std::string chat_error_;
};

}  // namespace kvq
