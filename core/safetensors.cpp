#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/io.h"

namespace kvq {

size_t safetensors_dtype_size(std::string_view dt) {
  if (dt == "U8" || dt == "I8" || dt == "BOOL" || dt == "F8_E4M3" || dt == "F8_E5M2") return 1;
  if (dt == "U16" || dt == "I16" || dt == "F16" || dt == "BF16") return 2;
  if (dt == "U32" || dt == "I32" || dt == "F32") return 4;
  if (dt == "U64" || dt == "I64" || dt == "F64") return 8;
  return 0;
}

namespace {

size_t dtype_size(const std::string& dt) {
  const size_t n = safetensors_dtype_size(dt);
  if (n == 0) fail("safetensors: unknown dtype {}", dt);
  return n;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::function<void(size_t, std::ostream&)>& write_bytes,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h;
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::vector<uint64_t> sizes;
  uint64_t off = 0;
  for (const auto& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const uint64_t bytes = static_cast<uint64_t>(n) * dtype_size(t.dtype);
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
    sizes.push_back(bytes);
    off += bytes;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t len = header.size();
  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  try {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("{}: cannot open for writing ({})", path, std::strerror(errno));
    out.write(reinterpret_cast<const char*>(&len), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::streamoff begin = out.tellp();
      write_bytes(i, out);
      const auto wrote = static_cast<uint64_t>(out.tellp() - begin);
      KVQ_CHECK(wrote == sizes[i], "{}: tensor {} got {} bytes, its shape and dtype need {}", path,
                tensors[i].name, wrote, sizes[i]);
    }
    out.flush();
    if (!out) fail("{}: write failed ({})", path, std::strerror(errno));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    fail("{}: cannot rename temporary into place ({})", path, ec.message());
  }
}

void write_safetensors(const std::string& path, const std::vector<RawTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const uint64_t bytes = static_cast<uint64_t>(n) * dtype_size(t.dtype);
    KVQ_CHECK(bytes == t.bytes.size(), "safetensors: tensor {} has {} bytes for {} {} values",
              t.name, t.bytes.size(), n, t.dtype);
    entries.push_back({t.name, t.dtype, t.shape, 0, bytes});
  }
  write_safetensors(
      path, entries,
      [&](size_t i, std::ostream& out) {
        out.write(tensors[i].bytes.data(), static_cast<std::streamsize>(tensors[i].bytes.size()));
      },
      metadata);
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<RawTensor> raw;
  for (const auto& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    KVQ_CHECK(n == static_cast<int64_t>(t.data.size()),
              "safetensors: tensor {} has {} values for shape of {}", t.name, t.data.size(), n);
    raw.push_back({t.name, "F32", t.shape,
                   std::string(reinterpret_cast<const char*>(t.data.data()), t.data.size() * 4)});
  }
  write_safetensors(path, raw, metadata);
}

std::vector<NamedTensor> read_safetensors(const std::string& path) {
  return parse_safetensors(read_file(path), path);
}

std::vector<SafetensorsEntry> parse_safetensors_header(std::string_view b, uint64_t file_size,
                                                       const std::string& path) {
  KVQ_CHECK(b.size() >= 8 && file_size >= b.size(),
            "{}: not a safetensors file (shorter than 8 bytes)", path);
  uint64_t len = 0;
  std::memcpy(&len, b.data(), 8);
  KVQ_CHECK(len <= file_size - 8, "{}: header length {} exceeds the file size", path, len);
  KVQ_CHECK(len <= b.size() - 8, "{}: header of {} bytes not given whole", path, len);
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(b.substr(8, len));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: safetensors header is not valid JSON", path);
  }
  KVQ_CHECK(h.is_object(), "{}: safetensors header is not a JSON object", path);
  const uint64_t data0 = 8 + len, data_len = file_size - data0;
  std::vector<SafetensorsEntry> out;
  for (const auto& [name, e] : h.items()) {
    if (name == "__metadata__") continue;
    KVQ_CHECK(
        e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"),
        "{}: tensor '{}' lacks dtype, shape or data_offsets", path, name);
    KVQ_CHECK(e["dtype"].is_string(), "{}: tensor '{}' has a dtype that is not a string", path,
              name);
    KVQ_CHECK(e["shape"].is_array(), "{}: tensor '{}' has a shape that is not an array", path,
              name);
    const auto& off = e["data_offsets"];
    KVQ_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                  off[1].is_number_unsigned(),
              "{}: tensor '{}' has data_offsets that are not two byte offsets [begin, end]", path,
              name);
    SafetensorsEntry t;
    t.name = name;
    t.dtype = e["dtype"].get<std::string>();
    const size_t item = safetensors_dtype_size(t.dtype);
    KVQ_CHECK(item, "{}: tensor '{}' has dtype {}, which safetensors does not define", path, name,
              t.dtype);
    uint64_t n = 1;
    for (const auto& d : e["shape"]) {
      KVQ_CHECK(d.is_number_unsigned() && d.get<uint64_t>() < (1ull << 40),
                "{}: tensor '{}' has a bad shape", path, name);
      t.shape.push_back(d.get<int64_t>());
      // checked before multiplying, so the count cannot wrap (2^32 x 2^32 is not 0 values)
      KVQ_CHECK(d.get<uint64_t>() == 0 || n < (1ull << 40) / d.get<uint64_t>(),
                "{}: tensor '{}' is too large (shape {})", path, name, e["shape"].dump());
      n *= d.get<uint64_t>();
    }
    const uint64_t a = off[0].get<uint64_t>(), z = off[1].get<uint64_t>();
    KVQ_CHECK(a <= z && z <= data_len,
              "{}: tensor '{}' data [{}, {}) lies outside the {} data bytes", path, name, a, z,
              data_len);
    KVQ_CHECK(z - a == n * item, "{}: tensor '{}' has {} bytes for {} values of {}", path, name,
              z - a, n, t.dtype);
    t.offset = data0 + a;
    t.bytes = z - a;
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<NamedTensor> parse_safetensors(const std::string& b, const std::string& path) {
  std::vector<NamedTensor> out;
  for (const SafetensorsEntry& e : parse_safetensors_header(b, b.size(), path)) {
    const std::string& dt = e.dtype;
    const size_t item = dt == "F32" ? 4 : (dt == "F16" || dt == "BF16") ? 2 : 0;
    KVQ_CHECK(item, "{}: tensor '{}' has dtype {} (supported: F32, F16, BF16)", path, e.name, dt);
    NamedTensor t;
    t.name = e.name;
    t.shape = e.shape;
    const uint64_t n = e.bytes / item;
    t.data.resize(n);
    const char* p = b.data() + e.offset;
    for (uint64_t i = 0; i < n; ++i) {
      if (item == 4) {
        std::memcpy(&t.data[i], p + 4 * i, 4);
      } else {
        uint16_t u;
        std::memcpy(&u, p + 2 * i, 2);
        t.data[i] = dt == "F16" ? half_bits_to_float(u) : bf16_bits_to_float(u);
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

MappedSafetensors MappedSafetensors::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open safetensors file ({})", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  const size_t len = static_cast<size_t>(st.st_size);
  void* a = len > 0 ? ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  const int err = errno;
  ::close(fd);
  if (a == MAP_FAILED) fail("{}: cannot mmap safetensors file ({})", path, std::strerror(err));
  MappedSafetensors m;
  m.name_ = path;
  m.owner_ = std::shared_ptr<const void>(a, [len](const void* p) {
    if (p) ::munmap(const_cast<void*>(p), len);
  });
  m.base_ = static_cast<const uint8_t*>(a);
  m.entries_ = parse_safetensors_header(
      std::string_view(reinterpret_cast<const char*>(m.base_), len), len, path);
  return m;
}

void MappedSafetensors::release(const SafetensorsEntry& e) const {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(base_ + e.offset),
                  z = reinterpret_cast<uintptr_t>(base_ + e.offset + e.bytes);
  const uintptr_t a1 = (a + page - 1) / page * page, z1 = z / page * page;  // whole pages inside
  if (z1 > a1) ::madvise(reinterpret_cast<void*>(a1), z1 - a1, MADV_DONTNEED);  // advice only
}

}  // namespace kvq
