// kvq::Error keeps its message on one line whatever it quotes (core/error.h). Fuzzing found
// specs, npy headers and GGUF keys whose newlines reached the message (fuzz/README.md); the
// expected strings are written out by hand.
#include "core/error.h"

#include <gtest/gtest.h>

#include <string>

#include "core/spec.h"

namespace kvq {
namespace {

TEST(Error, ControlCharactersEscaped_messageIsOneLine) {
  EXPECT_STREQ(Error("a\nb\rc\x01" "d\x7f" "e\tf").what(), "a\\nb\\rc\\x01d\\x7fe\\x09f");
  EXPECT_STREQ(Error("plain text, UTF-8 kept: caf\xc3\xa9").what(),
               "plain text, UTF-8 kept: caf\xc3\xa9");
}

// fuzz_spec's first finding: "k=ki\n\n\n" put three newlines into the message.
TEST(Error, SpecWithNewlines_fuzzFinding) {
  try {
    parse_spec("k=ki\n\n\n");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find("k=ki\\n\\n\\n"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace kvq
