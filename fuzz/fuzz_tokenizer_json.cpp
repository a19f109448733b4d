// Hugging Face tokenizer.json parsing (Tokenizer::from_tokenizer_json_text, model/tokenizer.h):
// the input is a tokenizer.json, optionally followed by a NUL byte and a tokenizer_config.json.
// A rejected file must be a one-line kvq::Error; an accepted one must encode a few strings
// (parse_special and add_special both ways) to ids inside its vocabulary, decode them and render
// or refuse a chat.
#include "fuzz/fuzz_util.h"
#include "model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvq;
  const std::string s = fuzz::bytes(data, size);
  const size_t nul = s.find('\0');
  const std::string json = s.substr(0, nul);
  const std::string config = nul == std::string::npos ? "" : s.substr(nul + 1);
  fuzz::accept_errors([&] {
    const Tokenizer t = Tokenizer::from_tokenizer_json_text(json, config, "fuzz/tokenizer.json");
    const std::string texts[] = {"Hello world! 123 don't", " a  b\n\nc\t\r\n",
                                 "\xFF\xC3(\xC3\xA9\xE4\xB8\xAD", json.substr(0, 48)};
    for (const std::string& text : texts) {
      for (bool special : {false, true}) {
        const auto ids = t.encode(text, special, special);
        for (int32_t id : ids) fuzz::require(id >= 0 && id < t.vocab_size());
        (void)t.decode(ids);
        (void)t.decode(ids, true);
      }
    }
    (void)t.chat({{"user", "hi"}, {"assistant", "ok"}});
  });
  return 0;
}
