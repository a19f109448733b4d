// BPE tokenizer: one engine fed by two sources.
//   - A GGUF's tokenizer.* metadata (from_gguf): byte-level BPE (tokenizer.ggml.model "gpt2") with
//     the "smollm" pre-tokenizer (llama.cpp's name for SmolLM2's), vocabulary in GPT-2's
//     byte-to-unicode form, merges "a b" in rank order, token types and special ids.
//   - A Hugging Face tokenizer.json (from_tokenizer_json), with tokenizer_config.json beside it
//     for bos/eos/chat_template: model BPE, byte-level (GPT-2, SmolLM2, Llama-3, Qwen2/2.5/3) or
//     Metaspace/SentencePiece-style with byte fallback (Llama-2, Mistral); see tokenizer_json.cpp
//     for the exact subset of normalizers, pre-tokenizers, post-processors and decoders read.
// Both fill the same tables (vocabulary, merges, added tokens, normalizer and pre-tokenizer steps,
// decoder), and encode/decode run the same code for both, which reproduces the `tokenizers`
// library's Tokenizer.encode/decode (see tokenizer.cpp for the pipeline).
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

/// \brief A BPE tokenizer (SmolLM2's from its GGUF, or a Hugging Face tokenizer.json).
/// Immutable after construction; encode/decode are thread-safe.
/// Any byte string encodes (invalid UTF-8 included: each invalid byte is a piece of its own). For
/// byte-level BPE, decode(encode(s)) == s except that bytes with no token of their own (see
/// encodable) are dropped, as `tokenizers` and llama.cpp do. For Metaspace BPE the round trip
/// holds for text without added tokens when every character has a token or a byte-fallback token
/// (Metaspace prepend_scheme "first" then loses a leading space, as `tokenizers` does). An NFC
/// normalizer (Qwen) makes it decode(encode(s)) == NFC(s).
class Tokenizer {
 public:
  /// \brief Builds the tokenizer from a GGUF's tokenizer.* metadata. Throws kvq::Error for a
  /// model other than "gpt2", a pre-tokenizer other than "smollm", or inconsistent vocab/merges.
  static Tokenizer from_gguf(const gguf::GgufFile& f);

  /// \brief Builds the tokenizer from a Hugging Face checkpoint's tokenizer files. `path` is a
  /// tokenizer.json file or the folder that holds one; tokenizer_config.json in the same folder
  /// (bos_token, eos_token, pad_token, unk_token, chat_template) and chat_template.jinja (which
  /// newer transformers write instead of the config's chat_template) are read when present.
  /// Throws a one-line kvq::Error naming the file for anything outside the supported subset.
  static Tokenizer from_tokenizer_json(const std::string& path);
  /// \brief The same from the files' contents (`tokenizer_config` may be empty; `name` is used in
  /// error messages): what from_tokenizer_json does after reading them.
  static Tokenizer from_tokenizer_json_text(std::string_view tokenizer_json,
                                            std::string_view tokenizer_config,
                                            const std::string& name,
                                            std::string_view chat_template_jinja = {});

  /// \brief Token ids of `text`.
  /// With `parse_special`, the text of special tokens (GGUF: CONTROL/USER_DEFINED; tokenizer.json:
  /// added_tokens with "special": true) such as "<|im_start|>" becomes that token (leftmost, then
  /// longest match); otherwise it is tokenized as ordinary text. Non-special added tokens of a
  /// tokenizer.json are always matched, as `tokenizers` does.
  /// With `add_special`, the post-processor's tokens are added around the ids (tokenizer.json's
  /// TemplateProcessing, e.g. Llama's BOS; GGUF's tokenizer.ggml.add_bos_token/add_eos_token).
  /// encode(text, true, true) is `tokenizers`' Tokenizer.encode(text) (add_special_tokens=True);
  /// encode(text, true, false) is the same with add_special_tokens=False. The defaults add nothing
  /// (SmolLM2 adds nothing either way).
  std::vector<int32_t> encode(std::string_view text, bool parse_special = false,
                              bool add_special = false) const;
  /// \brief The first `n` tokens of encode(text) (all of them for n <= 0) without encoding the
  /// whole text: a prefix cut after a newline that precedes an ASCII letter or digit (no piece
  /// spans one) is encoded, growing until it yields n tokens. Encodes the whole text when the
  /// vocabulary could merge across such a cut.
  std::vector<int32_t> encode_first(std::string_view text, int64_t n) const;

  /// \brief The bytes of `ids` as the decoder makes them (special tokens as their text unless
  /// `skip_special`). Unlike `tokenizers`, invalid UTF-8 comes back as the raw bytes, not U+FFFD.
  /// Throws kvq::Error for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  /// \brief Renders the chat template for (role, content) messages, for the templates recognized
  /// by their markers: ChatML (SmolLM2, Qwen2/2.5, Qwen3; a default system message first when the
  /// template has one and messages[0] is not "system"), Llama-3's header format, and the [INST]
  /// formats of Llama-2 and Mistral. Appends the assistant prompt if `add_generation_prompt`.
  /// The result holds special tokens as text: encode it with parse_special and without
  /// add_special (the templates write their own BOS). Throws kvq::Error for any other template
  /// or none.
  std::string chat(const std::vector<std::pair<std::string, std::string>>& messages,
                   bool add_generation_prompt = true) const;

  int32_t bos() const { return bos_; }  ///< -1 when the source names none
  int32_t eos() const { return eos_; }
  int32_t pad() const { return pad_; }
  int32_t unk() const { return unk_; }
  int32_t vocab_size() const { return static_cast<int32_t>(text_.size()); }
  /// \brief True when encode(text, ..., add_special=true) starts with bos().
  bool adds_bos() const { return !prefix_.empty() && prefix_.front() == bos_ && bos_ >= 0; }
  /// \brief The token as stored in the vocabulary (byte-to-unicode form, e.g. "Ġthe").
  std::string_view token(int32_t id) const;
  /// \brief The bytes the token decodes to in mid-sequence (" the"): stream generated text with
  /// this, not with decode({id}), which strips a Metaspace tokenizer's leading space.
  std::string_view token_bytes(int32_t id) const;
  /// \brief True for special tokens (GGUF CONTROL / USER_DEFINED; tokenizer.json added tokens
  /// with "special": true), matched only by encode(..., true).
  bool is_special(int32_t id) const;
  /// \brief False for a byte that encodes to no token when alone (SmolLM2 lacks 21, e.g. 0x04,
  /// 0xff); encode drops such bytes.
  bool encodable(uint8_t byte) const { return byte_token_[byte] >= 0; }
  /// \brief The pre-tokenizer: tokenizer.ggml.pre ("smollm") for a GGUF, the tokenizer.json's
  /// step types (e.g. "Split+ByteLevel", "Metaspace", "none") for a tokenizer.json.
  const std::string& pre_tokenizer() const { return pre_; }

 private:
  struct Pipeline;     // compiled normalizer / pre-tokenizer steps, shared by copies
  struct EncodeState;  // per-call scratch: match data, piece cache, BPE buffers
  struct JsonLoader;   // tokenizer_json.cpp
  struct Merge {
    int32_t rank;
    int32_t id;  // the merged token
  };
  struct Added {  // an added token (tokenizer.json) or a GGUF special token
    int32_t id;
    bool special, lstrip, rstrip, single_word;
  };
  enum class ChatFormat { kNone, kChatMl, kLlama3, kLlama2, kMistral };

  Tokenizer() = default;
  void finish(std::shared_ptr<Pipeline> pipe);  // derived tables
  void set_chat_template(const std::string& tmpl, const std::string& name);
  void encode_with_added(std::string_view text, bool parse_special, EncodeState& st) const;
  void encode_normalized(std::string_view text, bool at_origin, bool parse_special,
                         EncodeState& st) const;
  void pre_tokenize(size_t step, std::string_view piece, bool at_origin, EncodeState& st) const;
  void split_pieces(size_t step, std::string_view s, bool at_origin, EncodeState& st) const;
  void encode_piece(std::string_view piece, EncodeState& st) const;
  void bpe(std::string_view piece, EncodeState& st) const;
  const Merge* find_merge(int32_t left, int32_t right) const;

  std::shared_ptr<const Pipeline> pipe_;
  std::string pre_;
  std::vector<std::string> text_;   // vocabulary strings as stored
  std::vector<std::string> bytes_;  // what each token decodes to in mid-sequence
  std::vector<uint8_t> special_;    // 1 for special tokens
  // Added tokens matched before the model: on the raw text (GGUF specials; tokenizer.json's
  // "normalized": false) and on the normalized text ("normalized": true), longest text first.
  std::vector<Added> added_raw_, added_norm_;
  int32_t byte_token_[256] = {};  // byte-level: each byte's token; else its byte-fallback token
  int32_t fallback_[256] = {};    // byte_fallback: the <0xNN> tokens (-1 when off or absent)
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  // Model options (tokenizer.json's BPE).
  bool byte_level_ = true;      // pieces are bytes mapped by GPT-2's byte-to-unicode table
  bool ignore_merges_ = false;  // a piece that is a vocabulary entry is that token
  bool fuse_unk_ = false;
  int32_t model_unk_ = -1;  // the model's unk_token, used for characters without a token
  std::unordered_map<std::string, int32_t> vocab_;  // model vocabulary, stored form (not GGUF)
  // Post-processor and decoder.
  std::vector<int32_t> prefix_, suffix_;
  int strip_start_ = 0, strip_stop_ = 0;  // decoder Strip(" ", start, stop) after Fuse
  bool strip_first_token_space_ = false;  // decoder Metaspace (prepend_scheme not never)
  bool newline_cut_safe_ = true;          // encode_first may cut after "\n" + [A-Za-z0-9]
  std::string word_start_;  // "\u2581" when no token holds it past its start (encode_piece)
  int32_t bos_ = -1, eos_ = -1, pad_ = -1, unk_ = -1;
  ChatFormat chat_ = ChatFormat::kNone;
  std::string chat_system_;    // ChatML: the template's default system message ("" for none)
  bool chat_think_ = false;    // ChatML: Qwen3's <think> block on the last assistant message
  bool chat_variant_ = false;  // Llama-3: 3.1's dated system prelude; Mistral: v0.3's "[/INST]"
  std::string chat_error_;
};

}  // namespace kvq
