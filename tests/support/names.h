// GoogleTest parameter names from scheme specs and the like.
#pragma once

#include <cctype>
#include <string>

namespace kvq::testing {

/// \brief `s` with every character that is not a letter or digit turned into '_' (what
/// GoogleTest accepts in a parameterized test's name): "kivi2:g=32" -> "kivi2_g_32".
inline std::string test_name(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

}  // namespace kvq::testing
