// A Hugging Face checkpoint folder: config.json, the weights in one model.safetensors or in shards
// listed by model.safetensors.index.json, and tokenizer.json. The shards are memory-mapped and
// the tensors read in place: the model multiplies F32/F16/BF16 matrices there (WeightStore::
// kMapped, sharing the mapping's ownership) or copies them into panels (kPacked).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/safetensors.h"
#include "model/arch.h"

namespace kvq {

/// \brief model.safetensors.index.json's weight_map (tensor name -> shard file name), checked:
/// a JSON object with a weight_map object of plain file names (no directories); `name` stands
/// for the file in errors.
std::map<std::string, std::string> parse_safetensors_index(const std::string& text,
                                                           const std::string& name);

class HfCheckpoint {
 public:
  /// \brief Whether `path` names a checkpoint folder (a directory) rather than a GGUF file: the
  /// one place that decides which kind of model source a path is.
  static bool is_folder(const std::string& path);
  /// \brief Opens `dir`: reads config.json (model/arch.h's table), maps the shards. Errors name
  /// the file and the key or tensor: a missing config.json or shard, a tensor the index lists
  /// that its shard lacks, one tensor in two shards.
  static HfCheckpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const LlamaConfig& config() const { return config_; }
  /// \brief dir/tokenizer.json (whether or not it exists).
  std::string tokenizer_path() const { return dir_ + "/tokenizer.json"; }
  /// \brief quantization_config.weight_block_size of an fp8 checkpoint ({128, 128} when unsaid).
  std::pair<int64_t, int64_t> fp8_block() const { return fp8_block_; }

  /// \brief The tensor named `name`, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
  /// \brief The tensor named `name`; throws naming the folder and the tensor.
  const SafetensorsEntry& tensor(const std::string& name) const;
  /// \brief Its bytes, in place in the mapping.
  const uint8_t* data(const SafetensorsEntry& e) const;
  /// \brief Drops `e`'s pages from memory once read (MappedSafetensors::release).
  void release(const SafetensorsEntry& e) const;
  /// \brief Shares ownership of the mapping holding `e` (MappedSafetensors::owner): data(e) stays
  /// valid while the returned pointer lives, after this object is gone.
  std::shared_ptr<const void> owner(const SafetensorsEntry& e) const;
  /// \brief The shard file holding `e`.
  const std::string& file_of(const SafetensorsEntry& e) const;
  /// \brief Bytes of all tensors.
  uint64_t tensor_bytes() const;

 private:
  std::string dir_;
  LlamaConfig config_;
  std::pair<int64_t, int64_t> fp8_block_{128, 128};
  std::vector<MappedSafetensors> files_;
  std::map<std::string, std::pair<size_t, size_t>> where_;  // name -> (file, entry)
};

}  // namespace kvq
