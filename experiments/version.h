// The version `kvq --version` prints: "kvq X.Y.Z (commit C)", C from the build's git checkout
// (`git describe --always --dirty`), or "unknown" when built outside one. Generated at every build
// by cmake/version.cmake, so it names the commit the binary was built from.
#pragma once

#include <string>

#include "kernels/cpu/isa.h"

namespace kvq {
const char* version_string();

/// \brief What `kvq --version` prints: version_string(), then backend cpu's CPU paths compiled in
/// and the one this machine runs (kernels/cpu/isa.h; KVQ_CPU_PATH forces one).
inline std::string version_text() {
  return std::string(version_string()) + "\nbackend cpu: paths " + cpu::compiled_paths() +
         "; this machine runs " + cpu::path().name + " (" + cpu::isa() + ")";
}
}  // namespace kvq
