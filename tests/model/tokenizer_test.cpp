// SmolLM2's tokenizer (model/tokenizer.h) against ids from an independent implementation:
// tests/fixtures/tokenizer_cases.json, written by experiments/plots/make_tokenizer_fixtures.py
// with Hugging Face's `tokenizers` over the same GGUF's vocabulary and merges. Needs the real
// model (scripts/fetch-model.sh); every test skips without it.
#include "tests/support/model.h"
#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/gguf.h"

namespace kvq {
namespace {

using nlohmann::json;

constexpr int32_t kVocab = 49152;

// The fetched model, found where the commands look (tests/support/model.h).
std::string find_model() { return kvq::testing::model_file(); }

const json& fixtures() {
  static const json doc = [] {
    std::ifstream in(std::string(KVQ_SOURCE_DIR) + "/tests/fixtures/tokenizer_cases.json");
    if (!in) throw Error("tests/fixtures/tokenizer_cases.json is missing");
    return json::parse(in);
  }();
  return doc;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

// FNV-1a over the ids' little-endian int32 bytes (as the fixture generator computes it).
std::string fnv1a64(const std::vector<int32_t>& ids) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (int32_t id : ids) {
    const auto u = static_cast<uint32_t>(id);
    for (int k = 0; k < 4; ++k) h = (h ^ ((u >> (8 * k)) & 0xFF)) * 0x100000001B3ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = find_model();
    if (path.empty()) return;
    try {
      tok_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(gguf::GgufFile::open(path)));
    } catch (const std::exception& e) {
      load_error_ = e.what();
    }
  }
  static void TearDownTestSuite() { tok_.reset(); }
  void SetUp() override {
    ASSERT_EQ(load_error_, "") << "loading the tokenizer failed";
    if (!tok_)
      GTEST_SKIP() << "SmolLM2-135M-Instruct.Q4_1.gguf not in $KVQ_MODEL_DIR or ~/.cache/kvq; "
                      "run scripts/fetch-model.sh";
  }
  const Tokenizer& tok() const { return *tok_; }

  // decode(encode(s)) == s less the bytes without a token, with ids in range, both with and
  // without special parsing.
  void expect_round_trip(const std::string& s, const std::string& label) const {
    std::string kept;
    for (char c : s)
      if (tok().encodable(static_cast<uint8_t>(c))) kept.push_back(c);
    for (bool special : {false, true}) {
      const auto ids = tok().encode(s, special);
      for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < kVocab) << label << ": id " << id;
      ASSERT_EQ(tok().decode(ids), kept) << label << " parse_special=" << special;
    }
  }

  static std::unique_ptr<Tokenizer> tok_;
  static std::string load_error_;
};

std::unique_ptr<Tokenizer> TokenizerTest::tok_;
std::string TokenizerTest::load_error_;

TEST_F(TokenizerTest, VocabularyAndSpecialIds) {
  EXPECT_EQ(tok().vocab_size(), kVocab);
  EXPECT_EQ(tok().pre_tokenizer(), "smollm");
  EXPECT_EQ(tok().bos(), 1);
  EXPECT_EQ(tok().eos(), 2);
  EXPECT_EQ(tok().pad(), 2);
  EXPECT_EQ(tok().unk(), 0);
  EXPECT_EQ(tok().token(0), "<|endoftext|>");
  EXPECT_EQ(tok().token(1), "<|im_start|>");
  EXPECT_EQ(tok().token(2), "<|im_end|>");
  EXPECT_EQ(tok().token(260), "\xC4\xA0the");  // "Ġthe"
  EXPECT_EQ(tok().token_bytes(260), " the");
  for (int32_t id = 0; id <= 16; ++id) EXPECT_TRUE(tok().is_special(id)) << id;
  EXPECT_FALSE(tok().is_special(17));
  EXPECT_FALSE(tok().is_special(kVocab - 1));
  // The 21 bytes SmolLM2 has no token for, as the fixture generator found them.
  std::vector<int> unencodable;
  for (int b = 0; b < 256; ++b)
    if (!tok().encodable(static_cast<uint8_t>(b))) unencodable.push_back(b);
  EXPECT_EQ(unencodable, fixtures().at("unencodable_bytes").get<std::vector<int>>());
  EXPECT_EQ(tok().encode(std::string("\x04\xff\xc0", 3)), std::vector<int32_t>{});
  EXPECT_THROW(tok().token(-1), Error);
  EXPECT_THROW(tok().token(kVocab), Error);
  const std::vector<int32_t> bad = {5, kVocab};
  EXPECT_THROW(tok().decode(bad), Error);
}

TEST_F(TokenizerTest, FixturesEncodeToReferenceIds) {
  const auto& cases = fixtures().at("cases");
  ASSERT_GE(cases.size(), 30u);
  for (const auto& c : cases) {
    const std::string name = c.at("name"), text = c.at("text");
    const auto expected = c.at("ids").get<std::vector<int32_t>>();
    const auto ids = tok().encode(text, c.at("parse_special").get<bool>());
    EXPECT_EQ(ids, expected) << name << "\n  got      " << show(ids) << "\n  expected "
                             << show(expected);
    expect_round_trip(text, name);
  }
}

TEST_F(TokenizerTest, SpecialTokensOnlyWhenParsed) {
  const std::vector<int32_t> im_start = {1};
  EXPECT_EQ(tok().encode("<|im_start|>", true), im_start);
  const auto as_text = tok().encode("<|im_start|>", false);
  EXPECT_GT(as_text.size(), 1u);
  for (int32_t id : as_text) EXPECT_FALSE(tok().is_special(id)) << id;
  EXPECT_EQ(tok().decode(as_text), "<|im_start|>");
  EXPECT_EQ(tok().decode(im_start), "<|im_start|>");

  // Specials split ordinary text exactly where they stand; a near miss stays text.
  const auto ids = tok().encode("hi<|im_end|><|endoftext|> <|im_end|", true);
  std::vector<int32_t> expected = tok().encode("hi");
  expected.push_back(2);
  expected.push_back(0);
  const auto tail = tok().encode(" <|im_end|");
  expected.insert(expected.end(), tail.begin(), tail.end());
  EXPECT_EQ(ids, expected);
  EXPECT_EQ(tok().decode(ids), "hi<|im_end|><|endoftext|> <|im_end|");
}

TEST_F(TokenizerTest, ChatTemplateOneTurn) {
  const std::string expected =
      "<|im_start|>system\n"
      "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      "<|im_start|>user\n"
      "What is the capital of France?<|im_end|>\n"
      "<|im_start|>assistant\n";
  const std::string s = tok().chat({{"user", "What is the capital of France?"}});
  EXPECT_EQ(s, expected);
  const auto ids = tok().encode(s, true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);

  // With a system message there is no default one; without the prompt, no assistant header.
  EXPECT_EQ(tok().chat({{"system", "S"}, {"user", "U"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
  EXPECT_EQ(tok().chat({}, true), "<|im_start|>assistant\n");
}

TEST_F(TokenizerTest, ChatTemplateMatchesJinjaRendering) {
  for (const auto& c : fixtures().at("chat")) {
    std::vector<std::pair<std::string, std::string>> messages;
    for (const auto& m : c.at("messages")) messages.emplace_back(m.at("role"), m.at("content"));
    EXPECT_EQ(tok().chat(messages, c.at("add_generation_prompt").get<bool>()),
              c.at("text").get<std::string>())
        << c.at("name").get<std::string>();
  }
}

TEST_F(TokenizerTest, RandomBytesRoundTrip) {
  std::mt19937_64 rng(20240611);
  const std::vector<std::string> atoms = {" ",
                                          "  ",
                                          "\n",
                                          "\t",
                                          "a",
                                          "Z",
                                          "7",
                                          "'s",
                                          "'",
                                          "\xC3\xA9",
                                          "\xE4\xB8\xAD",
                                          "\xF0\x9F\xA6\x80",
                                          "\xCC\x81",
                                          "<|im_end|>",
                                          "<|im_start|>",
                                          "<|",
                                          "\xC3",
                                          "\xE4\xB8",
                                          "\xF0\x9F",
                                          "\x80",
                                          "\xFF",
                                          "\xC0\xAF",
                                          "\xED\xA0\x80",
                                          "\xF4\x90\x80\x80",
                                          "\x00"};
  int invalid = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string s;
    const int len = static_cast<int>(rng() % 120);
    for (int k = 0; k < len; ++k) {
      if (it % 3 == 0)
        s.push_back(static_cast<char>(rng() & 0xFF));  // raw bytes, mostly invalid UTF-8
      else
        s += atoms[rng() % atoms.size()];
    }
    invalid += std::any_of(s.begin(), s.end(), [](char c) { return (c & 0x80) != 0; });
    expect_round_trip(s, "random case " + std::to_string(it));
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(invalid, 1000);
}

TEST_F(TokenizerTest, EncodableBytesRoundTripExactly) {
  // Every byte that has a token, alone, in pairs and in random runs: decode(encode(s)) == s.
  std::string all;
  for (int b = 0; b < 256; ++b)
    if (tok().encodable(static_cast<uint8_t>(b))) all.push_back(static_cast<char>(b));
  std::mt19937_64 rng(7);
  for (int it = 0; it < 2000; ++it) {
    std::string s;
    const int len = it < 256 ? 1 + it % 2 : static_cast<int>(rng() % 64);
    for (int k = 0; k < len; ++k) s.push_back(all[rng() % all.size()]);
    const auto ids = tok().encode(s);
    ASSERT_EQ(tok().decode(ids), s) << "case " << it;
  }
  EXPECT_EQ(tok().decode(tok().encode(all)), all);
}

TEST_F(TokenizerTest, LongRunsStayFast) {
  // One huge piece each: BPE must not be quadratic, PCRE2 must not run out of stack.
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string& s :
       {std::string(200000, 'a'), std::string(200000, ' '), std::string(200000, '\n'),
        std::string(100000, '!'), std::string(100000, '7'), std::string(100000, '\xFF'),
        std::string(50000, ' ') + "x" + std::string(50000, '\t')}) {
    expect_round_trip(s, "run of " + std::to_string(s.size()));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 20.0);
}

TEST_F(TokenizerTest, KingJamesBible) {
  const auto& doc = fixtures();
  if (!doc.contains("kjv")) GTEST_SKIP() << "fixture has no kjv entry";
  const auto& kjv = doc.at("kjv");
  const std::string cmd = kjv.at("command").get<std::string>() + " 2>/dev/null";
  std::string text;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
    pclose(p);
  }
  if (text.size() != kjv.at("bytes").get<size_t>())
    GTEST_SKIP() << "`" << kjv.at("command").get<std::string>() << "` gave " << text.size()
                 << " bytes, not " << kjv.at("bytes").get<size_t>()
                 << " (apt-get install bible-kjv)";
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok().encode(text);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "KJV: " << text.size() << " bytes -> " << ids.size() << " tokens in " << secs
            << " s (" << static_cast<double>(text.size()) / secs / 1e6 << " MB/s)\n";
  RecordProperty("kjv_encode_seconds", std::to_string(secs));
  EXPECT_EQ(ids.size(), kjv.at("tokens").get<size_t>());
  EXPECT_EQ(fnv1a64(ids), kjv.at("ids_fnv1a64").get<std::string>());
  EXPECT_EQ(tok().decode(ids), text);
  EXPECT_LT(secs, 30.0);
}

}  // namespace
}  // namespace kvq
