// npy reader on arbitrary bytes (core/npy.h parse_npy): a parsed array's values match its shape.
#include "core/npy.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvq;
  fuzz::accept_errors([&] {
    const NpyArray a = parse_npy(fuzz::bytes(data, size), "fuzz.npy");
    int64_t n = 1;
    for (int64_t d : a.shape) n *= d;
    fuzz::require(n == static_cast<int64_t>(a.data.size()));
    // what is read is a little more than what the file holds, never more (allocation guard)
    fuzz::require(a.data.size() <= size);
  });
  return 0;
}
