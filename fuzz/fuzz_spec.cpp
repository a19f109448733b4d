// Scheme specs on arbitrary strings (core/spec.h parse_spec): a spec that parses has a canonical
// form that parses to the same canonical form.
#include "core/spec.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvq;
  fuzz::accept_errors([&] {
    const SchemeSpec s = parse_spec(fuzz::bytes(data, size));
    const std::string c = s.canonical();
    fuzz::require(parse_spec(c).canonical() == c);
  });
  return 0;
}
