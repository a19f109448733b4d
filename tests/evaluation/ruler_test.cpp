// evaluation/ruler.h: the RULER-style suite's generator and scorer. The scorer against
// hand-computed cases (RULER's string_match_all / string_match_part definitions); the generator
// on SmolLM2's tokenizer: determinism from the seed, prompt lengths, and each task's answers in
// its prompt as many times as RULER's definition of the task puts them there, counted in the
// decoded prompt.
#include "evaluation/ruler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/gguf.h"
#include "evaluation/model_files.h"

namespace kvq::eval {
namespace {

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// RULER's scripts/eval/synthetic: string_match_all is the mean over the references of "the
// reference, lower-cased, is a substring of the lower-cased prediction"; string_match_part is 1
// when any is.
TEST(RulerScore, StringMatchAllAndPartByHand) {
  const std::vector<std::string> refs{"1234567", "7654321", "2222222"};
  EXPECT_DOUBLE_EQ(string_match_all("The numbers are 1234567 and 7654321.", refs), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(string_match_part("The numbers are 1234567 and 7654321.", refs), 1.0);
  EXPECT_DOUBLE_EQ(string_match_all("none here", refs), 0.0);
  EXPECT_DOUBLE_EQ(string_match_part("none here", refs), 0.0);
  EXPECT_DOUBLE_EQ(string_match_all("x 2222222 1234567 7654321", refs), 1.0);
  // Case-insensitive both ways, and a substring is enough (RULER's test, not a word match).
  EXPECT_DOUBLE_EQ(string_match_all("they are: abcde, FGHIJ", {"ABCDE", "fghij"}), 1.0);
  EXPECT_DOUBLE_EQ(string_match_all("bold-eagles", {"Bold-Eagle"}), 1.0);
  EXPECT_DOUBLE_EQ(string_match_all("1. apple 2. pear", {"apple", "pear", "plum", "fig"}), 0.5);
  EXPECT_THROW(string_match_all("x", {}), Error);
}

// RULER's postprocess_pred: strip, every character below 0x20 becomes a newline, strip again.
TEST(RulerScore, PostprocessTurnsControlCharactersIntoNewlines) {
  EXPECT_EQ(ruler_postprocess("  1234567\x01tail\t\n "), "1234567\ntail");
  EXPECT_EQ(ruler_postprocess("\x02\x03"), "");
  EXPECT_EQ(ruler_postprocess("a\tb"), "a\nb");
}

TEST(RulerTasks, NamesGroupsAndGenerationBudgetsAreRulers) {
  std::map<std::string, int> gen;
  for (const RulerTask& t : ruler_tasks()) gen[std::string(t.name)] = t.gen_tokens;
  EXPECT_EQ(gen.size(), 12u);
  EXPECT_EQ(gen["niah_single_1"], 128);  // RULER's constants.py: niah 128, vt 30, cwe 120, fwe 50
  EXPECT_EQ(gen["vt"], 30);
  EXPECT_EQ(gen["cwe"], 120);
  EXPECT_EQ(gen["fwe"], 50);
  try {
    (void)ruler_task("qa_1");
    FAIL() << "an unknown task was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("niah_multikey_2"), std::string::npos) << e.what();
  }
}

// Scoring is a substring test, so no pool word may sit inside another (or a word value would
// count as found inside a longer one).
TEST(RulerTasks, NoPoolWordIsASubstringOfAnother) {
  const auto& w = ruler_words();
  EXPECT_GE(w.size(), 400u);
  for (size_t i = 0; i < w.size(); ++i)
    for (size_t j = 0; j < w.size(); ++j)
      if (i != j) {
        ASSERT_EQ(w[j].find(w[i]), std::string::npos) << w[i] << " in " << w[j];
      }
}

class RulerCases : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = cli::model_dir();
    const std::string gguf = dir + "/SmolLM2-135M-Instruct.Q4_1.gguf", kjv = dir + "/kjv.txt";
    if (!std::filesystem::exists(gguf) || !std::filesystem::exists(kjv)) return;
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(gguf::GgufFile::open(gguf)));
    text_ = std::make_unique<RulerHaystack>(ruler_haystack(*tok_, cli::read_text("kjv"), false));
    noise_ = std::make_unique<RulerHaystack>(ruler_haystack(*tok_, "", true));
  }
  static void TearDownTestSuite() {
    tok_.reset();
    text_.reset();
    noise_.reset();
  }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << "model or text not fetched (scripts/fetch-model.sh, fetch-text.sh)";
  }
  static RulerCase make(std::string_view task, int length, int sample = 0, uint64_t seed = 1) {
    return ruler_case(*tok_, *text_, task, length, seed, sample);
  }
  static std::string text(const RulerCase& c) { return tok_->decode(c.prompt); }
  static std::unique_ptr<Tokenizer> tok_;
  static std::unique_ptr<RulerHaystack> text_, noise_;
};
std::unique_ptr<Tokenizer> RulerCases::tok_;
std::unique_ptr<RulerHaystack> RulerCases::text_, RulerCases::noise_;

TEST_F(RulerCases, SameSeedSameCaseAnyOrder) {
  for (const RulerTask& t : ruler_tasks()) {
    const RulerCase a = make(t.name, 1024, 3, 7);
    (void)make(t.name, 1024, 4, 7);  // another case in between changes nothing
    const RulerCase b = make(t.name, 1024, 3, 7);
    EXPECT_EQ(a.prompt, b.prompt) << t.name;
    EXPECT_EQ(a.answers, b.answers) << t.name;
    EXPECT_NE(make(t.name, 1024, 2, 7).answers, a.answers) << t.name << ": sample 2 == sample 3";
    EXPECT_NE(make(t.name, 1024, 3, 8).answers, a.answers) << t.name << ": seed 8 == seed 7";
  }
}

// The needle and vt prompts are assembled to the token; cwe and fwe lists grow by whole entries
// (kRulerListSlack). Every prompt leaves the task's generation budget, as RULER's do.
TEST_F(RulerCases, PromptPlusGenerationHitsTheLength) {
  for (int length : {1024, 2048, 4096})
    for (const RulerTask& t : ruler_tasks()) {
      const RulerCase c = make(t.name, length);
      const int64_t total = static_cast<int64_t>(c.prompt.size()) + c.gen_tokens;
      EXPECT_EQ(c.gen_tokens, t.gen_tokens);
      if (t.group == "niah" || t.group == "vt")
        EXPECT_EQ(total, length) << t.name;
      else
        EXPECT_TRUE(total <= length && total >= length - kRulerListSlack)
            << t.name << " at " << length << ": " << total;
    }
  const RulerCase longest = make("niah_multikey_2", 8192);  // the model's whole context
  EXPECT_EQ(longest.prompt.size() + 128, 8192u);
  EXPECT_THROW(make("cwe", 300), Error);  // no room: a clear error, not a short prompt
}

// RULER's niah: each of a case's needles once in the haystack ("One of the special magic
// {type} for {key} is: {value}."), the queried keys' values the answers: 1 for the single
// tasks, 1 of 4 keys for multikey_1, 4 values of one key for multivalue, 4 keys for multiquery.
TEST_F(RulerCases, EachNeedleValueOnceAndTheAnswersAreTheQueriedKeys) {
  const std::map<std::string, size_t> answers{
      {"niah_single_1", 1},     {"niah_single_2", 1},   {"niah_single_3", 1},
      {"niah_single_words", 1}, {"niah_multikey_1", 1}, {"niah_multikey_2", 1},
      {"niah_multikey_3", 1},   {"niah_multivalue", 4}, {"niah_multiquery", 4}};
  for (const auto& [task, n] : answers)
    for (int sample = 0; sample < 3; ++sample) {
      const RulerCase c = make(task, 2048, sample);
      const std::string s = text(c);
      ASSERT_EQ(c.answers.size(), n) << task;
      for (const auto& a : c.answers) {
        EXPECT_EQ(occurrences(s, a), 1u) << task << " sample " << sample << ": " << a;
        EXPECT_EQ(occurrences(s, " is: " + a + ".\n"), 1u) << task << ": " << a;
      }
      const bool singular = n == 1;
      EXPECT_NE(s.find(singular ? "mentioned in the provided text is"
                                : "mentioned in the provided text are"),
                std::string::npos);
    }
  // Values by kind: 7-digit numbers, adjective-noun words, version-4 UUIDs.
  EXPECT_EQ(make("niah_single_2", 1024).answers[0].size(), 7u);
  const std::string word = make("niah_single_words", 1024).answers[0];
  EXPECT_NE(word.find('-'), std::string::npos) << word;
  const std::string uuid = make("niah_single_3", 1024).answers[0];
  ASSERT_EQ(uuid.size(), 36u) << uuid;
  EXPECT_EQ(uuid[14], '4') << uuid;
  EXPECT_NE(std::string("89ab").find(uuid[19]), std::string::npos) << uuid;
  // multikey_1 hides 4 keys' needles, multikey_2 a haystack made of needles.
  EXPECT_EQ(occurrences(text(make("niah_multikey_1", 2048)), "One of the special magic numbers"),
            4u);
  EXPECT_GT(occurrences(text(make("niah_multikey_2", 2048)), "One of the special magic numbers"),
            40u);
}

// The haystack key: the text (KJV) where RULER reads essays, or RULER's repeated sentences;
// niah_single_1 and vt use the noise whatever the key says, as RULER defines them.
TEST_F(RulerCases, HaystackIsTheTextOrTheNoise) {
  const std::string kjv = text(make("niah_single_2", 1024));
  EXPECT_NE(kjv.find("In the beginning God created"), std::string::npos);
  EXPECT_EQ(kjv.find("The grass is green."), std::string::npos);
  const std::string noise =
      tok_->decode(ruler_case(*tok_, *noise_, "niah_single_2", 1024, 1, 0).prompt);
  EXPECT_EQ(noise.find("In the beginning"), std::string::npos);
  EXPECT_GT(occurrences(noise, "The grass is green. The sky is blue."), 20u);
  EXPECT_EQ(text(make("niah_single_1", 1024)).find("In the beginning"), std::string::npos);
}

// RULER's vt: one chain "VAR A = 12345", "VAR B = VAR A", ... of 4 hops: the first name appears
// twice (assigned the value, then read), the middle ones twice, the last once; the question names
// the value. The example before it uses 3-letter names.
TEST_F(RulerCases, VariableTrackingChainIsComplete) {
  for (int sample = 0; sample < 3; ++sample) {
    const RulerCase c = make("vt", 2048, sample);
    const std::string s = text(c);
    ASSERT_EQ(c.answers.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(c.answers[i].size(), 5u);
      EXPECT_EQ(occurrences(s, c.answers[i]), i == 4 ? 1u : 2u) << c.answers[i];
      if (i > 0) {
        EXPECT_EQ(occurrences(s, "VAR " + c.answers[i] + " = VAR " + c.answers[i - 1] + "\n"), 1u);
      }
    }
    const size_t at = s.find("VAR " + c.answers[0] + " = ");
    ASSERT_NE(at, std::string::npos);
    const std::string value = s.substr(at + 12, 5);
    EXPECT_NE(s.find("assgined the value " + value + ", they are:"), std::string::npos) << value;
  }
}

// RULER's cwe: 10 words 6 times each below 4,096 tokens and 30 times from 4,096 on, the rest
// once (3 times); the answers are those 10. Counted as list entries ". word" in the decoded
// prompt (the one-shot example uses other words).
TEST_F(RulerCases, CommonWordsAppearTheirCountTimes) {
  for (int length : {2048, 4096}) {
    const RulerCase c = make("cwe", length);
    const std::string s = text(c);
    ASSERT_EQ(c.answers.size(), 10u);
    const size_t expect = length < 4096 ? 6 : 30;
    for (const auto& a : c.answers) {
      const size_t n = occurrences(s, ". " + a + " ") + occurrences(s, ". " + a + "\n");
      EXPECT_EQ(n, expect) << a << " at " << length;
    }
    // every other word of the list less often
    const size_t list = s.rfind("Memorize the ones that appear most often.\n");
    std::map<std::string, size_t> freq;
    std::istringstream in(s.substr(list, s.find("\nQuestion", list) - list));
    for (std::string w; in >> w;)
      if (std::find(c.answers.begin(), c.answers.end(), w) == c.answers.end()) ++freq[w];
    for (const auto& w : ruler_words())
      if (freq.count(w)) {
        EXPECT_LT(freq[w], expect) << w;
      }
  }
}

// RULER's fwe: the answers are the three most frequent coded words after "...", each strictly
// more frequent than every word outside them (counted in the decoded coded text).
TEST_F(RulerCases, FrequentWordsAreTheThreeMostFrequent) {
  for (int length : {1024, 4096}) {
    const RulerCase c = make("fwe", length);
    const std::string s = text(c);
    const size_t a = s.find("coded words. ") + 13;
    std::map<std::string, size_t> freq;
    std::istringstream in(s.substr(a, s.find("\nQuestion", a) - a));
    for (std::string w; in >> w;) ++freq[w];
    ASSERT_EQ(c.answers.size(), 3u);
    size_t least = SIZE_MAX;
    for (const auto& ans : c.answers) {
      EXPECT_EQ(ans.size(), 6u);
      least = std::min(least, freq[ans]);
    }
    for (const auto& [w, n] : freq)
      if (w != "..." && std::find(c.answers.begin(), c.answers.end(), w) == c.answers.end()) {
        EXPECT_LT(n, least) << w << " at " << length;
      }
    EXPECT_GT(freq["..."], least);
  }
}

}  // namespace
}  // namespace kvq::eval
