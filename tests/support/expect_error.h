// The one check of kvq's error contract (a one-line kvq::Error that names what to fix) for tests.
#pragma once

#include <gtest/gtest.h>

#include <concepts>
#include <string>

#include "core/error.h"

namespace kvq::testing {

/// \brief Expects fn() to throw kvq::Error with a one-line message containing `piece`; returns
/// the message ("" when nothing was thrown) for checks of its own.
template <std::invocable Fn>
std::string expect_error(Fn&& fn, const std::string& piece) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(piece), std::string::npos) << "'" << msg << "' lacks '" << piece << "'";
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    return msg;
  }
  ADD_FAILURE() << "no kvq::Error; expected one mentioning '" << piece << "'";
  return "";
}

}  // namespace kvq::testing
