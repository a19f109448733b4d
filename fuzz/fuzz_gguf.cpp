// GGUF on arbitrary bytes (core/gguf.h GgufFile::parse): header, metadata of every value type,
// the tensor table and every block type's size rules; then what kvq reads from a GGUF - every
// tensor's values, the Llama config and the tokenizer - each in its own try.
#include "core/gguf.h"
#include "fuzz/fuzz_util.h"
#include "model/llama.h"
#include "model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvq;
  fuzz::accept_errors([&] {
    const gguf::GgufFile f = gguf::GgufFile::parse(fuzz::bytes(data, size), "fuzz.gguf");
    for (const auto& t : f.tensors()) {
      fuzz::require(t.offset + t.nbytes <= size);  // the table was checked against the file
      fuzz::accept_errors([&] {
        const std::vector<float> v = f.dequantize(t);
        fuzz::require(static_cast<int64_t>(v.size()) == t.nelements);
      });
    }
    fuzz::accept_errors([&] { (void)LlamaModel::read_config(f); });
    fuzz::accept_errors([&] {
      const Tokenizer tok = Tokenizer::from_gguf(f);
      (void)tok.encode("In the beginning God created the heaven and the earth.");
    });
  });
  return 0;
}
