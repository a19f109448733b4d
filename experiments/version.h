// The version `kvq --version` prints: "kvq X.Y.Z (commit C)", C from the build's git checkout
// (`git describe --always --dirty`), or "unknown" when built outside one. Generated at every build
// by cmake/version.cmake, so it names the commit the binary was built from.
#pragma once

namespace kvq {
const char* version_string();
}  // namespace kvq
