#include "evaluation/kv_input.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/npy.h"
#include "core/safetensors.h"

namespace kvq::cli {
namespace {

// "FILE.safetensors:TENSOR" -> {FILE.safetensors, TENSOR}; "FILE:TENSOR" where FILE exists and
// the whole argument names no file -> {FILE, TENSOR} (a safetensors file under another name: its
// header is checked as one); a plain path -> {path, ""}.
std::pair<std::string, std::string> split_tensor(const std::string& arg) {
  const std::string ext = ".safetensors";
  const size_t p = arg.rfind(ext + ":");
  if (p != std::string::npos)
    return {arg.substr(0, p + ext.size()), arg.substr(p + ext.size() + 1)};
  std::error_code ec;
  const size_t c = arg.rfind(':');
  if (c != std::string::npos && c > 0 && !std::filesystem::exists(arg, ec) &&
      std::filesystem::is_regular_file(arg.substr(0, c), ec))
    return {arg.substr(0, c), arg.substr(c + 1)};
  return {arg, ""};
}

// The tensor named `name` of a safetensors file; without a name, its only tensor.
NamedTensor pick_tensor(const std::string& file, const std::string& name) {
  std::vector<NamedTensor> ts = read_safetensors(file);
  KVQ_CHECK(!ts.empty(), "{}: holds no tensors", file);
  std::string names;
  for (size_t i = 0; i < ts.size() && i < 6; ++i) names += (i ? ", " : "") + ts[i].name;
  if (ts.size() > 6) names += fmt::format(", ... ({} in all)", ts.size());
  if (name.empty()) {
    KVQ_CHECK(ts.size() == 1,
              "{} holds {} tensors; name one as {}:TENSOR (e.g. {}:{}; tensors: {})", file,
              ts.size(), file, file, ts.front().name, names);
    return std::move(ts.front());
  }
  for (auto& t : ts)
    if (t.name == name) return std::move(t);
  fail("{}: no tensor '{}' (tensors: {})", file, name, names);
}

}  // namespace

std::string kv_input_file(const std::string& arg) { return split_tensor(arg).first; }

bool is_safetensors(const std::string& path) {
  return path.size() >= 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0;
}

KvInput as_kv(const std::string& arg, std::vector<int64_t> s, std::vector<float> data) {
  if (s.size() != 2 && s.size() != 3)
    fail("{}: rank {} array; expected [tokens, heads, head_dim] or [tokens, head_dim]", arg,
         s.size());
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == 0) fail("{}: zero-sized array (dimension {} is 0)", arg, i);
  KvInput in;
  in.file_shape = s;
  in.tensor.shape = s.size() == 3 ? Shape3{s[0], s[1], s[2]} : Shape3{s[0], 1, s[1]};
  for (size_t i = 0; i < data.size(); ++i) {
    if (!std::isfinite(data[i])) {
      const Shape3& sh = in.tensor.shape;
      const int64_t t = static_cast<int64_t>(i) / (sh.heads * sh.dim);
      const int64_t h = static_cast<int64_t>(i) / sh.dim % sh.heads;
      const int64_t d = static_cast<int64_t>(i) % sh.dim;
      fail("{}: non-finite value {} at token {}, head {}, channel {}; KV caches must be finite{}",
           arg, data[i], t, h, d,
           std::isinf(data[i]) ? " (a float64 beyond float32's range reads as inf)" : "");
    }
  }
  in.tensor.data = std::move(data);
  return in;
}

KvInput load_kv(const std::string& arg) {
  const auto [file, tensor] = split_tensor(arg);
  std::vector<int64_t> s;
  std::vector<float> data;
  if (is_safetensors(file) || file != arg) {  // FILE:TENSOR reads FILE as safetensors
    NamedTensor t = pick_tensor(file, tensor);
    s = t.shape;
    data = std::move(t.data);
  } else {
    NpyArray a = read_npy(file);
    if (a.descr.size() == 3 && (a.descr[0] == '>' || a.descr[2] == '8'))
      fmt::print(stderr, "kvq: note: {}: dtype '{}' ({}{}) read as float32{}\n", file, a.descr,
                 a.descr[0] == '>' ? "big-endian " : "",
                 a.descr[2] == '8'   ? "float64"
                 : a.descr[2] == '2' ? "float16"
                                     : "float32",
                 a.descr[2] == '8' ? ", each value rounded to the nearest float32" : " (exact)");
    s = std::move(a.shape);
    data = std::move(a.data);
  }
  return as_kv(arg, std::move(s), std::move(data));
}

}  // namespace kvq::cli
