// SmolLM2's tokenizer (from the fetched GGUF) on arbitrary bytes: every id is in the vocabulary
// and decode(encode(s)) is s without the bytes that have no token (model/tokenizer.h); with
// special-token parsing too.
#include <cstdlib>

#include "core/gguf.h"
#include "evaluation/model_files.h"
#include "fuzz/fuzz_util.h"
#include "model/tokenizer.h"

namespace {
const kvq::Tokenizer& tokenizer() {
  static const kvq::Tokenizer t =
      kvq::Tokenizer::from_gguf(kvq::gguf::GgufFile::open(kvq::cli::model_path("")));
  return t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvq;
  const Tokenizer& tok = tokenizer();
  const std::string s = fuzz::bytes(data, size);
  const std::vector<int32_t> ids = tok.encode(s);
  for (int32_t id : ids) fuzz::require(id >= 0 && id < tok.vocab_size());
  std::string kept;
  for (char c : s)
    if (tok.encodable(static_cast<uint8_t>(c))) kept += c;
  fuzz::require(tok.decode(ids) == kept);
  for (int32_t id : tok.encode(s, true)) fuzz::require(id >= 0 && id < tok.vocab_size());
  return 0;
}
