// safetensors reader on arbitrary bytes (core/safetensors.h parse_safetensors).
#include "core/safetensors.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvq;
  fuzz::accept_errors([&] {
    const auto ts = parse_safetensors(fuzz::bytes(data, size), "fuzz.safetensors");
    size_t values = 0;
    for (const auto& t : ts) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      fuzz::require(n == static_cast<int64_t>(t.data.size()));
      values += t.data.size();
    }
    fuzz::require(values <= size);  // every value came from at least one byte of the file
  });
  return 0;
}
