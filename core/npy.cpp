#include "core/npy.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/half.h"
#include "core/io.h"

namespace kvq {
namespace {

// Value of `key` in the header dict, as raw text up to the next top-level comma/brace.
std::string dict_value(const std::string& header, const std::string& key, const std::string& name) {
  const std::string k1 = "'" + key + "'";
  size_t p = header.find(k1);
  if (p == std::string::npos) p = header.find("\"" + key + "\"");
  if (p == std::string::npos) fail("{}: npy header has no '{}' entry", name, key);
  p = header.find(':', p);
  if (p == std::string::npos) fail("{}: malformed npy header near '{}'", name, key);
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  if (p < header.size() && header[p] == '(') {
    const size_t e = header.find(')', p);
    if (e == std::string::npos) fail("{}: malformed npy shape tuple", name);
    return header.substr(p, e - p + 1);
  }
  size_t e = p;
  while (e < header.size() && header[e] != ',' && header[e] != '}') ++e;
  std::string v = header.substr(p, e - p);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

}  // namespace

NpyArray parse_npy(const std::string& bytes, const std::string& name) {
  static const char kMagic[] = "\x93NUMPY";
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, 6) != 0)
    fail("{}: not an .npy file (missing \\x93NUMPY magic)", name);
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, pre = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    pre = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) fail("{}: truncated .npy header", name);
    uint32_t hl = 0;
    std::memcpy(&hl, bytes.data() + 8, 4);
    header_len = hl;
    pre = 12;
  } else {
    fail("{}: unsupported .npy format version {} (1, 2 and 3 are supported)", name, major);
  }
  if (pre + header_len > bytes.size()) fail("{}: truncated .npy header", name);
  const std::string header = bytes.substr(pre, header_len);

  NpyArray a;
  std::string descr = dict_value(header, "descr", name);
  if (descr.size() >= 2 && (descr.front() == '\'' || descr.front() == '"'))
    descr = descr.substr(1, descr.size() - 2);
  a.descr = descr;
  // Floats of 2, 4 or 8 bytes in either byte order ('=' and '|' are this machine's, little).
  size_t item = 0;
  bool swap = false;
  if (descr.size() == 3 && descr[1] == 'f' &&
      std::string("<=|>").find(descr[0]) != std::string::npos &&
      (descr[2] == '2' || descr[2] == '4' || descr[2] == '8')) {
    item = static_cast<size_t>(descr[2] - '0');
    swap = descr[0] == '>';
  } else {
    fail(
        "{}: unsupported dtype '{}' (expected float16, float32 or float64: '<f2', '<f4', '<f8', "
        "or big-endian '>f...')",
        name, descr);
  }

  const std::string fo = dict_value(header, "fortran_order", name);
  if (fo == "True") fail("{}: Fortran-order arrays are not supported; save with C order", name);
  if (fo != "False") fail("{}: malformed fortran_order value '{}'", name, fo);

  const std::string shp = dict_value(header, "shape", name);
  // A tuple of non-negative integers: "()", "(5,)", "(2, 3)" (a trailing comma allowed).
  if (shp.size() < 2 || shp.front() != '(' || shp.back() != ')')
    fail("{}: malformed npy shape '{}' (expected a tuple such as (2, 3))", name, shp);
  int64_t n = 1;
  std::string_view rest(shp.data() + 1, shp.size() - 2);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view tok = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    while (!tok.empty() && tok.front() == ' ') tok.remove_prefix(1);
    while (!tok.empty() && tok.back() == ' ') tok.remove_suffix(1);
    if (tok.empty() && comma == std::string_view::npos && !a.shape.empty()) break;  // "(5, )"
    if (tok.empty() || tok.find_first_not_of("0123456789") != std::string_view::npos)
      fail("{}: malformed npy shape '{}' (dimensions are non-negative integers)", name, shp);
    if (tok.size() > 15) fail("{}: absurd dimension {} in npy shape", name, tok);
    const int64_t d = std::stoll(std::string(tok));
    a.shape.push_back(d);
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / 16 / d)
      fail("{}: npy shape {} is too large", name, shp);
    n *= d;
  }
  const size_t data_off = pre + header_len;
  const size_t have = bytes.size() - data_off;
  const uint64_t want = static_cast<uint64_t>(n) * item;
  if (have != want)
    fail("{}: header shape {} needs {} data bytes but the file has {}", name, shp, want, have);
  a.data.resize(static_cast<size_t>(n));
  const char* p = bytes.data() + data_off;
  auto element = [&](int64_t i, auto zero) {  // element i as stored, byte-swapped if big-endian
    decltype(zero) v;
    char b[sizeof(v)];
    std::memcpy(b, p + i * static_cast<int64_t>(sizeof(v)), sizeof(v));
    if (swap) std::reverse(b, b + sizeof(v));
    std::memcpy(&v, b, sizeof(v));
    return v;
  };
  if (item == 4 && !swap) {
    if (want > 0) std::memcpy(a.data.data(), p, want);  // an empty array's data() may be null
  } else {
    for (int64_t i = 0; i < n; ++i) {
      float& out = a.data[static_cast<size_t>(i)];
      if (item == 2)
        out = half_bits_to_float(element(i, uint16_t{}));
      else if (item == 4)
        out = element(i, 0.0f);
      else
        out = static_cast<float>(element(i, 0.0));  // float64: nearest float32
    }
  }
  return a;
}

NpyArray read_npy(const std::string& path) { return parse_npy(read_file(path), path); }

std::string encode_npy(const std::vector<int64_t>& shape, const float* data) {
  std::string dims;
  int64_t n = 1;
  for (int64_t d : shape) {
    dims += fmt::format("{}, ", d);
    n *= d;
  }
  if (shape.size() > 1)
    dims.resize(dims.size() - 2);
  else if (shape.size() == 1)
    dims.resize(dims.size() - 1);
  std::string header =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n) * 4);
  return out;
}

void write_npy(const std::string& path, const std::vector<int64_t>& shape, const float* data) {
  write_file_atomic(path, encode_npy(shape, data));
}

}  // namespace kvq
