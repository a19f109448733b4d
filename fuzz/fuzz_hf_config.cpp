// A Hugging Face checkpoint folder's JSON on arbitrary bytes: config.json through the
// architecture table (model/arch.h parse_hf_config) and model.safetensors.index.json
// (model/hf_checkpoint.h parse_safetensors_index). An accepted config must be a shape the forward
// pass can run: whole head groups, an even head_dim, a window per layer or none, finite positive
// RoPE frequencies; an accepted index names plain files.
#include <cmath>

#include "fuzz/fuzz_util.h"
#include "model/arch.h"
#include "model/hf_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvq;
  const std::string text = fuzz::bytes(data, size);
  fuzz::accept_errors([&] {
    const LlamaConfig c = parse_hf_config(text, "config.json", size % 2 == 0);
    fuzz::require(c.layers >= 1 && c.heads >= 1 && c.kv_heads >= 1 && c.heads % c.kv_heads == 0);
    fuzz::require(c.head_dim >= 2 && c.head_dim % 2 == 0 && c.hidden >= 1 && c.vocab >= 1);
    fuzz::require(c.window.empty() || c.window.size() == static_cast<size_t>(c.layers));
    for (float f : rope_inv_freq(c)) fuzz::require(std::isfinite(f) && f > 0);
  });
  fuzz::accept_errors([&] {
    for (const auto& [tensor, file] : parse_safetensors_index(text, "index.json"))
      fuzz::require(!file.empty() && file.find('/') == std::string::npos);
  });
  return 0;
}
