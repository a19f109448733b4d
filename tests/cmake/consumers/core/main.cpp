// kvq::core alone: parses a spec, prints its canonical spelling, and exits nonzero unless parsing
// that spelling again gives the same rotation (RotSpec's defaulted operator==, C++20) and text.
#include <cstdio>

#include "core/spec.h"

int main() {
  const kvq::SchemeSpec s = kvq::parse_spec("kivi2:rot=hadamard:2,sink=3");
  const kvq::SchemeSpec again = kvq::parse_spec(s.canonical());
  std::printf("core: %s\n", s.canonical().c_str());
  return again.rot == s.rot && again.canonical() == s.canonical() && s.rot.on ? 0 : 1;
}
