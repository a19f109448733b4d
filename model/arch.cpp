#include "model/arch.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>

#include "core/error.h"

namespace kvq {

namespace {

using Json = nlohmann::json;

// The Llama layout every family here shares: Hugging Face's module names and llama.cpp's.
constexpr TensorName kLlamaNames[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"lm_head.weight", "output.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"model.layers.{}.input_layernorm.weight", "blk.{}.attn_norm.weight"},
    {"model.layers.{}.post_attention_layernorm.weight", "blk.{}.ffn_norm.weight"},
    {"model.layers.{}.self_attn.q_proj.weight", "blk.{}.attn_q.weight"},
    {"model.layers.{}.self_attn.k_proj.weight", "blk.{}.attn_k.weight"},
    {"model.layers.{}.self_attn.v_proj.weight", "blk.{}.attn_v.weight"},
    {"model.layers.{}.self_attn.o_proj.weight", "blk.{}.attn_output.weight"},
    {"model.layers.{}.mlp.gate_proj.weight", "blk.{}.ffn_gate.weight"},
    {"model.layers.{}.mlp.up_proj.weight", "blk.{}.ffn_up.weight"},
    {"model.layers.{}.mlp.down_proj.weight", "blk.{}.ffn_down.weight"},
    {"model.layers.{}.self_attn.q_proj.bias", "blk.{}.attn_q.bias"},
    {"model.layers.{}.self_attn.k_proj.bias", "blk.{}.attn_k.bias"},
    {"model.layers.{}.self_attn.v_proj.bias", "blk.{}.attn_v.bias"},
    {"model.layers.{}.self_attn.o_proj.bias", "blk.{}.attn_output.bias"},
    {"model.layers.{}.self_attn.q_norm.weight", "blk.{}.attn_q_norm.weight"},
    {"model.layers.{}.self_attn.k_norm.weight", "blk.{}.attn_k_norm.weight"},
};
static_assert(std::size(kLlamaNames) == static_cast<size_t>(TensorRole::kCount));

const std::vector<ArchEntry>& table() {
  static const std::vector<ArchEntry> t = {
      {"llama",
       {"llama"},
       {"LlamaForCausalLM"},
       "llama",
       kLlamaNames,
       false,
       true,
       false,
       WindowRule::kNone,
       "Llama 1-3.x and SmolLM2: rope_scaling type llama3, attention_bias, tied embeddings"},
      {"mistral",
       {"mistral"},
       {"MistralForCausalLM"},
       nullptr,
       kLlamaNames,
       false,
       false,
       false,
       WindowRule::kSlidingWindow,
       "Mistral: sliding_window attention when set"},
      {"qwen2",
       {"qwen2"},
       {"Qwen2ForCausalLM"},
       nullptr,
       kLlamaNames,
       true,
       false,
       false,
       WindowRule::kLayerTypes,
       "Qwen2 / Qwen2.5: q/k/v biases"},
      {"qwen3",
       {"qwen3"},
       {"Qwen3ForCausalLM"},
       nullptr,
       kLlamaNames,
       false,
       true,
       true,
       WindowRule::kLayerTypes,
       "Qwen3: q/k RMSNorm per head, head_dim given in the config"},
  };
  return t;
}

const Json* member(const Json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

int64_t int_key(const Json& j, const char* key, const std::string& name, int64_t lo, int64_t hi,
                const int64_t* fallback = nullptr) {
  const Json* v = member(j, key);
  if (!v) {
    KVQ_CHECK(fallback, "{}: key '{}' is missing", name, key);
    return *fallback;
  }
  KVQ_CHECK(v->is_number_integer(), "{}: key '{}' is {}, expected an integer", name, key,
            v->dump());
  const int64_t x = v->get<int64_t>();
  KVQ_CHECK(x >= lo && x <= hi, "{}: key '{}' = {} is outside [{}, {}]", name, key, x, lo, hi);
  return x;
}

double num_key(const Json& j, const char* key, const std::string& name, const double* fallback,
               const char* where = "") {
  const Json* v = member(j, key);
  if (!v) {
    KVQ_CHECK(fallback, "{}: key '{}{}' is missing", name, where, key);
    return *fallback;
  }
  KVQ_CHECK(v->is_number() && std::isfinite(v->get<double>()),
            "{}: key '{}{}' is {}, expected a number", name, where, key, v->dump());
  return v->get<double>();
}

bool bool_key(const Json& j, const char* key, const std::string& name, bool fallback) {
  const Json* v = member(j, key);
  if (!v) return fallback;
  KVQ_CHECK(v->is_boolean(), "{}: key '{}' is {}, expected true or false", name, key, v->dump());
  return v->get<bool>();
}

std::string str_key(const Json& j, const char* key) {
  const Json* v = member(j, key);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

}  // namespace

std::span<const ArchEntry> architectures() { return table(); }

std::string architecture_names() {
  std::string s;
  for (const ArchEntry& a : table())
    s +=
        fmt::format("{}{} ({})", s.empty() ? "" : ", ", a.family, fmt::join(a.architectures, ", "));
  return s;
}

const ArchEntry& arch_entry(std::string_view family) {
  for (const ArchEntry& a : table())
    if (family == a.family) return a;
  fail("architecture '{}' is not in the table (supported: {})", family, architecture_names());
}

std::string tensor_name(const ArchEntry& a, TensorRole role, int layer, bool hf) {
  const TensorName& n = a.names[static_cast<size_t>(role)];
  std::string s = hf ? n.hf : n.gguf;
  if (const size_t at = s.find("{}"); at != std::string::npos)
    s.replace(at, 2, std::to_string(layer));
  return s;
}

LlamaConfig parse_hf_config(const std::string& text, const std::string& name,
                            bool lm_head_present) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception&) {
    fail("{}: not valid JSON", name);
  }
  KVQ_CHECK(j.is_object(), "{}: not a JSON object", name);
  const std::string model_type = str_key(j, "model_type");
  std::vector<std::string> archs;
  if (const Json* a = member(j, "architectures"); a && a->is_array())
    for (const Json& x : *a)
      if (x.is_string()) archs.push_back(x.get<std::string>());
  const ArchEntry* entry = nullptr;
  for (const ArchEntry& a : table()) {
    for (const std::string& t : a.model_types) entry = t == model_type ? &a : entry;
    if (!entry && model_type.empty())
      for (const std::string& x : a.architectures)
        for (const std::string& y : archs) entry = x == y ? &a : entry;
  }
  KVQ_CHECK(entry, "{}: model_type '{}' (architectures [{}]) is not supported (supported: {})",
            name, model_type, fmt::join(archs, ", "), architecture_names());
  const ArchEntry& e = *entry;
  LlamaConfig c;
  c.family = e.family;
  c.rope_style = RopeStyle::kHalf;
  constexpr int64_t kMax = 1 << 24;
  c.layers = static_cast<int>(int_key(j, "num_hidden_layers", name, 1, 4096));
  c.hidden = static_cast<int>(int_key(j, "hidden_size", name, 1, kMax));
  c.heads = static_cast<int>(int_key(j, "num_attention_heads", name, 1, 4096));
  const int64_t heads = c.heads;
  c.kv_heads = static_cast<int>(int_key(j, "num_key_value_heads", name, 1, 4096, &heads));
  KVQ_CHECK(c.heads % c.kv_heads == 0,
            "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", name, c.heads,
            c.kv_heads);
  const int64_t hd = c.hidden / c.heads;
  c.head_dim = static_cast<int>(int_key(j, "head_dim", name, 2, 4096, &hd));
  KVQ_CHECK(c.head_dim % 2 == 0 && c.head_dim >= 2, "{}: head_dim {} is not even", name,
            c.head_dim);
  c.ffn = static_cast<int>(int_key(j, "intermediate_size", name, 1, kMax));
  c.vocab = static_cast<int>(int_key(j, "vocab_size", name, 1, kMax));
  c.context = static_cast<int>(int_key(j, "max_position_embeddings", name, 1, kMax));
  const double eps = num_key(j, "rms_norm_eps", name, nullptr);
  KVQ_CHECK(eps > 0 && eps < 1, "{}: key 'rms_norm_eps' = {} is outside (0, 1)", name, eps);
  c.rms_eps = static_cast<float>(eps);
  if (const std::string act = str_key(j, "hidden_act"); !act.empty())
    KVQ_CHECK(act == "silu", "{}: key 'hidden_act' is '{}'; kvq runs silu only", name, act);
  KVQ_CHECK(!bool_key(j, "mlp_bias", name, false),
            "{}: key 'mlp_bias' is true; kvq has no MLP "
            "biases",
            name);
  if (const Json* q = member(j, "quantization_config")) {
    const std::string m = q->is_object() ? str_key(*q, "quant_method") : "";
    KVQ_CHECK(m == "fp8",
              "{}: quantization_config.quant_method '{}' is not supported (kvq reads "
              "bf16/fp16/fp32 checkpoints and fp8 ones with their weight scales)",
              name, m);
  }
  // RoPE: transformers 5 writes rope_parameters {rope_theta, rope_type, ...}; older files hold
  // rope_theta and rope_scaling {type or rope_type, ...} at the top.
  const Json* rp = member(j, "rope_parameters");
  const char* rp_name = "rope_parameters.";
  if (!rp) {
    rp = member(j, "rope_scaling");
    rp_name = "rope_scaling.";
  }
  KVQ_CHECK(!rp || rp->is_object(), "{}: key '{}' is not an object", name,
            std::string(rp_name).substr(0, std::string(rp_name).size() - 1));
  const double theta_default = 10000.0;
  double theta = num_key(j, "rope_theta", name, &theta_default);
  if (rp && member(*rp, "rope_theta")) theta = num_key(*rp, "rope_theta", name, nullptr, rp_name);
  KVQ_CHECK(theta > 1, "{}: rope_theta {} is not above 1", name, theta);
  c.rope_theta = static_cast<float>(theta);
  if (rp) {
    std::string type = str_key(*rp, "rope_type");
    if (type.empty()) type = str_key(*rp, "type");
    const double one = 1.0;
    KVQ_CHECK(num_key(*rp, "partial_rotary_factor", name, &one, rp_name) == 1.0,
              "{}: key '{}partial_rotary_factor' is not 1 (kvq rotates the whole head)", name,
              rp_name);
    if (type == "llama3") {
      RopeScaling& s = c.rope_scaling;
      s.type = type;
      s.factor = num_key(*rp, "factor", name, nullptr, rp_name);
      s.low_freq_factor = num_key(*rp, "low_freq_factor", name, nullptr, rp_name);
      s.high_freq_factor = num_key(*rp, "high_freq_factor", name, nullptr, rp_name);
      const double orig = num_key(*rp, "original_max_position_embeddings", name, nullptr, rp_name);
      KVQ_CHECK(s.factor > 0 && s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor &&
                    orig >= 1 && orig <= kMax,
                "{}: rope llama3 parameters out of range (factor {}, low_freq_factor {}, "
                "high_freq_factor {}, original_max_position_embeddings {})",
                name, s.factor, s.low_freq_factor, s.high_freq_factor, orig);
      s.original_context = static_cast<int>(orig);
    } else {
      KVQ_CHECK(type.empty() || type == "default",
                "{}: key '{}rope_type' is '{}'; kvq supports default and llama3", name, rp_name,
                type);
    }
  }
  c.qkv_bias = e.qkv_bias;
  if (e.attention_bias && bool_key(j, "attention_bias", name, false)) {
    c.qkv_bias = true;
    c.o_bias = true;
  }
  c.qk_norm = e.qk_norm;
  c.tied = bool_key(j, "tie_word_embeddings", name, !lm_head_present);
  // Sliding window, per layer.
  const Json* sw = member(j, "sliding_window");
  auto window = [&] {
    KVQ_CHECK(sw, "{}: a sliding-window layer needs key 'sliding_window'", name);
    return static_cast<int>(int_key(j, "sliding_window", name, 1, kMax));
  };
  if (e.window == WindowRule::kSlidingWindow && sw) {
    c.window.assign(static_cast<size_t>(c.layers), window());
  } else if (e.window == WindowRule::kLayerTypes) {
    if (const Json* lt = member(j, "layer_types")) {
      KVQ_CHECK(lt->is_array() && lt->size() == static_cast<size_t>(c.layers),
                "{}: key 'layer_types' is not a list of {} strings", name, c.layers);
      for (const Json& t : *lt) {
        KVQ_CHECK(t.is_string() && (t == "sliding_attention" || t == "full_attention"),
                  "{}: key 'layer_types' holds {}; kvq knows full_attention and "
                  "sliding_attention",
                  name, t.dump());
        c.window.push_back(t == "sliding_attention" ? window() : 0);
      }
    } else if (bool_key(j, "use_sliding_window", name, false)) {
      const int64_t all = c.layers;
      const int64_t from = int_key(j, "max_window_layers", name, 0, 1 << 20, &all);
      for (int l = 0; l < c.layers; ++l) c.window.push_back(l >= from ? window() : 0);
    }
  }
  bool any = false;
  for (int w : c.window) any = any || w > 0;
  if (!any) c.window.clear();
  return c;
}

std::vector<float> rope_inv_freq(const LlamaConfig& c) {
  std::vector<float> f;
  for (int i = 0; i < c.head_dim / 2; ++i)
    f.push_back(static_cast<float>(
        std::pow(static_cast<double>(c.rope_theta), -2.0 * i / static_cast<double>(c.head_dim))));
  const RopeScaling& s = c.rope_scaling;
  if (s.type == "llama3") {
    // transformers' _compute_llama3_parameters: long wavelengths divided by `factor`, short ones
    // kept, those between interpolated by the smooth factor.
    const double low_wavelen = s.original_context / s.low_freq_factor;
    const double high_wavelen = s.original_context / s.high_freq_factor;
    for (float& x : f) {
      const double inv = x, wavelen = 2 * std::numbers::pi / inv;
      double out = wavelen > low_wavelen ? inv / s.factor : inv;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const double smooth = (s.original_context / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        out = (1 - smooth) * out / s.factor + smooth * out;
      }
      x = static_cast<float>(out);
    }
  }
  return f;
}

}  // namespace kvq
