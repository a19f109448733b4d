// The real model for tests: loaded once per test binary, or nullptr (tests skip) when
// scripts/fetch-model.sh has not run.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "core/gguf.h"
#include "evaluation/model_files.h"
#include "model/llama.h"
#include "model/tokenizer.h"

namespace kvq::testing {

struct RealModel {
  gguf::GgufFile file;
  LlamaModel model;
  Tokenizer tok;
};

/// \brief Path of the SmolLM2 GGUF in the model cache (cli::model_dir()), or "" if absent.
inline std::string model_file() {
  const std::string p = cli::model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  return std::filesystem::is_regular_file(p) ? p : "";
}

/// \brief The SmolLM2 GGUF from the model cache, or nullptr if it is absent.
inline const RealModel* real_model() {
  static std::unique_ptr<RealModel> m = []() -> std::unique_ptr<RealModel> {
    const std::string p = model_file();
    if (p.empty()) return nullptr;
    auto f = gguf::GgufFile::open(p);
    auto model = LlamaModel::load(f);
    auto tok = Tokenizer::from_gguf(f);
    return std::make_unique<RealModel>(RealModel{std::move(f), std::move(model), std::move(tok)});
  }();
  return m.get();
}

/// \brief The real model with attention on `b` (the default model is backend cpu; a copy is
/// loaded once for each other backend). Requires real_model() != nullptr.
inline const LlamaModel& model_with(AttentionBackend b) {
  if (b == AttentionBackend::kCpu) return real_model()->model;
  auto load = [](AttentionBackend x) {
    LlamaModel m = LlamaModel::load(real_model()->file);
    m.set_backend(x);
    return m;
  };
  static const LlamaModel ref = load(AttentionBackend::kRef);
  if (b == AttentionBackend::kRef) return ref;
  static const LlamaModel int8 = load(AttentionBackend::kCpuInt8);
  return int8;
}

#define KVQ_REQUIRE_MODEL()                                                            \
  const ::kvq::testing::RealModel* M = ::kvq::testing::real_model();                   \
  if (!M)                                                                              \
  GTEST_SKIP() << "model file absent: run scripts/fetch-model.sh (the README's setup " \
                  "does)"

}  // namespace kvq::testing
