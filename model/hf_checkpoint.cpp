#include "model/hf_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/io.h"

namespace kvq {

namespace fs = std::filesystem;

std::map<std::string, std::string> parse_safetensors_index(const std::string& text,
                                                           const std::string& name) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    fail("{}: not valid JSON", name);
  }
  KVQ_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
            "{}: key 'weight_map' (an object of tensor name -> shard file) is missing", name);
  std::map<std::string, std::string> out;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    KVQ_CHECK(file.is_string(), "{}: weight_map['{}'] is {}, expected a shard file name", name,
              tensor, file.dump());
    const std::string f = file.get<std::string>();
    KVQ_CHECK(!f.empty() && f.find('/') == std::string::npos && f.find('\\') == std::string::npos &&
                  f != "." && f != "..",
              "{}: weight_map['{}'] = '{}' is not a file name in the folder", name, tensor, f);
    out[tensor] = f;
  }
  KVQ_CHECK(!out.empty(), "{}: weight_map lists no tensors", name);
  return out;
}

bool HfCheckpoint::is_folder(const std::string& path) { return fs::is_directory(path); }

HfCheckpoint HfCheckpoint::open(const std::string& dir) {
  KVQ_CHECK(fs::is_directory(dir), "{}: not a directory", dir);
  HfCheckpoint c;
  c.dir_ = dir;
  const std::string config = dir + "/config.json";
  KVQ_CHECK(fs::is_regular_file(config),
            "{}: no config.json (a Hugging Face checkpoint folder holds config.json, "
            "*.safetensors and tokenizer.json)",
            dir);
  const std::string text = read_file(config);
  // The shards: the index's, else every *.safetensors in the folder.
  const std::string index = dir + "/model.safetensors.index.json";
  std::map<std::string, std::string> listed;
  std::vector<std::string> shards;
  if (fs::is_regular_file(index)) {
    listed = parse_safetensors_index(read_file(index), index);
    std::set<std::string> s;
    for (const auto& [t, f] : listed) s.insert(f);
    for (const std::string& f : s) {
      KVQ_CHECK(fs::is_regular_file(dir + "/" + f), "{}: shard {} (holding tensor {}) is missing",
                index, f, std::find_if(listed.begin(), listed.end(), [&](const auto& p) {
                            return p.second == f;
                          })->first);
      shards.push_back(f);
    }
  } else {
    // transformers' names: one model.safetensors, else the index. Other *.safetensors in the
    // folder (K/V dumps, a consolidated copy, other tools' files) are not weights and are not read.
    std::vector<std::string> others;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() == ".safetensors")
        others.push_back(e.path().filename().string());
    std::sort(others.begin(), others.end());
    KVQ_CHECK(
        fs::is_regular_file(dir + "/model.safetensors"),
        "{}: no model.safetensors and no model.safetensors.index.json (the names transformers "
        "reads){}{}",
        dir, others.empty() ? "" : "; found ", fmt::join(others, ", "));
    shards.push_back("model.safetensors");
  }
  for (const std::string& f : shards) {
    c.files_.push_back(MappedSafetensors::open(dir + "/" + f));
    const MappedSafetensors& m = c.files_.back();
    for (size_t i = 0; i < m.entries().size(); ++i) {
      const std::string& name = m.entries()[i].name;
      if (!listed.empty()) {
        const auto it = listed.find(name);
        if (it == listed.end() || it->second != f) continue;  // the index names another shard
      }
      const auto [at, fresh] = c.where_.emplace(name, std::pair{c.files_.size() - 1, i});
      KVQ_CHECK(fresh, "{}: tensor {} is in both {} and {}", dir, name,
                c.files_[at->second.first].name(), m.name());
    }
  }
  for (const auto& [t, f] : listed)
    KVQ_CHECK(c.where_.count(t), "{}: tensor {} that {} lists is not in the file", dir + "/" + f, t,
              index);
  c.config_ = parse_hf_config(text, config, c.find("lm_head.weight") != nullptr);
  const auto j = nlohmann::json::parse(text);
  if (j.contains("quantization_config") && j["quantization_config"].is_object() &&
      j["quantization_config"].contains("weight_block_size")) {
    const auto& b = j["quantization_config"]["weight_block_size"];
    KVQ_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_unsigned() &&
                  b[1].is_number_unsigned() && b[0].get<int64_t>() >= 1 && b[1].get<int64_t>() >= 1,
              "{}: key 'quantization_config.weight_block_size' is {}, expected [rows, columns]",
              config, b.dump());
    c.fp8_block_ = {b[0].get<int64_t>(), b[1].get<int64_t>()};
  }
  return c;
}

const SafetensorsEntry* HfCheckpoint::find(const std::string& name) const {
  const auto it = where_.find(name);
  return it == where_.end() ? nullptr : &files_[it->second.first].entries()[it->second.second];
}

const SafetensorsEntry& HfCheckpoint::tensor(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  KVQ_CHECK(e, "{}: tensor {} is missing (in no *.safetensors of the folder)", dir_, name);
  return *e;
}

namespace {
template <class Files, class Where>
size_t file_index(const Files& files, const Where& where, const SafetensorsEntry& e) {
  const auto it = where.find(e.name);
  KVQ_CHECK(it != where.end() && &files[it->second.first].entries()[it->second.second] == &e,
            "checkpoint: tensor {} is not one of this folder's", e.name);
  return it->second.first;
}
}  // namespace

const uint8_t* HfCheckpoint::data(const SafetensorsEntry& e) const {
  return files_[file_index(files_, where_, e)].data(e);
}

void HfCheckpoint::release(const SafetensorsEntry& e) const {
  files_[file_index(files_, where_, e)].release(e);
}

std::shared_ptr<const void> HfCheckpoint::owner(const SafetensorsEntry& e) const {
  return files_[file_index(files_, where_, e)].owner();
}

const std::string& HfCheckpoint::file_of(const SafetensorsEntry& e) const {
  return files_[file_index(files_, where_, e)].name();
}

uint64_t HfCheckpoint::tensor_bytes() const {
  uint64_t b = 0;
  for (const auto& [name, w] : where_) b += files_[w.first].entries()[w.second].bytes;
  return b;
}

}  // namespace kvq
