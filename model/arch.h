// The architecture table: every model family kvq runs is one entry here (its Hugging Face
// model_type and architectures names, the config.json keys it reads, its tensor names, and the
// optional pieces it has), and a model's shape and flags are one LlamaConfig, whether it came from
// a GGUF's llama.* metadata or a checkpoint folder's config.json. The forward pass (model/llama.h)
// reads the flags; it has no branch per family.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvq {

/// \brief Which channels RoPE rotates together.
enum class RopeStyle {
  kAdjacent,  ///< pairs (2i, 2i + 1): GGUF's llama layout (its converter permutes q/k rows)
  kHalf,      ///< pairs (i, i + D/2): Hugging Face's rotate_half, the checkpoint's own layout
};

/// \brief rope_scaling / rope_parameters beyond the plain inverse frequencies.
struct RopeScaling {
  std::string type;  ///< "" (none) or "llama3"
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int original_context = 0;  ///< original_max_position_embeddings
};

/// \brief Model hyperparameters and the architecture's flags (one entry of the table applied to
/// one checkpoint).
struct LlamaConfig {
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int context = 0;
  float rms_eps = 1e-5f, rope_theta = 10000.0f;
  std::string family = "llama";  ///< the table entry (ArchEntry::family)
  RopeStyle rope_style = RopeStyle::kAdjacent;
  RopeScaling rope_scaling;
  bool qkv_bias = false;  ///< q, k and v projections carry biases (qwen2; llama attention_bias)
  bool o_bias = false;    ///< the output projection carries a bias (llama attention_bias)
  bool qk_norm = false;   ///< RMSNorm over each head of q and k before RoPE (qwen3)
  bool tied = true;       ///< the output head is the token embeddings (no separate head tensor)
  /// Per layer: attend to the last `window[l]` positions only (the position itself included, as
  /// transformers' sliding-window mask); 0 or an empty vector: the whole context.
  std::vector<int> window;
  /// Width of the attention's q and output: heads x head_dim (qwen3's head_dim is given
  /// explicitly and need not divide hidden).
  int q_dim() const { return heads * head_dim; }
  int window_of(int layer) const { return window.empty() ? 0 : window[static_cast<size_t>(layer)]; }
};

/// \brief The tensors a family's checkpoint holds, by role.
enum class TensorRole {
  kEmbed,
  kOutput,
  kOutNorm,
  kAttnNorm,
  kFfnNorm,
  kQ,
  kK,
  kV,
  kO,
  kGate,
  kUp,
  kDown,
  kQBias,
  kKBias,
  kVBias,
  kOBias,
  kQNorm,
  kKNorm,
  kCount
};

/// \brief One role's names: "{}" stands for the layer number.
struct TensorName {
  const char* hf;
  const char* gguf;
};

/// \brief How a family's config says which layers attend through a sliding window.
enum class WindowRule {
  kNone,           ///< never
  kSlidingWindow,  ///< every layer when `sliding_window` is a number (mistral)
  kLayerTypes,     ///< `layer_types` "sliding_attention", else use_sliding_window with
                   ///< max_window_layers (qwen2, qwen3)
};

/// \brief One family.
struct ArchEntry {
  const char* family;
  std::vector<std::string> model_types;    ///< config.json model_type values
  std::vector<std::string> architectures;  ///< config.json architectures values
  const char* gguf_arch;                   ///< general.architecture it maps, or nullptr
  std::span<const TensorName> names;       ///< indexed by TensorRole
  bool qkv_bias;                           ///< q/k/v biases always (qwen2)
  bool attention_bias;  ///< config key attention_bias turns on q/k/v/o biases (llama)
  bool qk_norm;         ///< q_norm / k_norm per head (qwen3)
  WindowRule window;
  const char* what;  ///< one line for --help and the README
};

/// \brief The table.
std::span<const ArchEntry> architectures();
/// \brief "llama (LlamaForCausalLM), mistral (...)...": the supported names, for errors and help.
std::string architecture_names();
/// \brief The tensor name of `role` (layer `layer` where the name has one) in a checkpoint folder
/// (hf) or a GGUF.
std::string tensor_name(const ArchEntry& a, TensorRole role, int layer, bool hf);
/// \brief The entry named `family`; throws if none.
const ArchEntry& arch_entry(std::string_view family);

/// \brief A checkpoint folder's config.json text as a LlamaConfig, checked; `name` stands for the
/// file in errors (which name the key: missing, wrong type, out of range; an unknown model_type
/// lists the supported ones). `tied` is tie_word_embeddings when the file says it, else whether
/// the checkpoint lacks lm_head.weight (`lm_head_present`).
LlamaConfig parse_hf_config(const std::string& text, const std::string& name, bool lm_head_present);

/// \brief The RoPE inverse frequencies of `c` (head_dim / 2 of them): theta^(-2i/D) (in double,
/// rounded to float), then rope_scaling's rescaling (llama3: transformers'
/// _compute_llama3_parameters).
std::vector<float> rope_inv_freq(const LlamaConfig& c);

}  // namespace kvq
