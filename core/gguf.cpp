#include "core/gguf.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/half.h"

namespace kvq::gguf {

static_assert(std::endian::native == std::endian::little,
              "GGUF reader assumes a little-endian host");

namespace {

constexpr uint32_t kMaxDims = 4;   // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;  // nested metadata arrays; bounds the parser's recursion
constexpr uint64_t kDefaultAlignment = 32;
// Smallest encodings, used to reject counts that cannot fit in the bytes left.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // key length, type, one-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // name length, n_dims, type, offset
constexpr uint64_t kMinStringBytes = 8;                  // length prefix
constexpr uint64_t kMinArrayBytes = 4 + 8;               // element type, count

// ---- ggml block layouts (ggml-common.h); fp16 fields are raw bits --------------------------

constexpr int QK = 32;     // elements per block of the legacy formats
constexpr int QK_K = 256;  // elements per K-quant super-block

struct BlockQ4_0 {  // 4.5 bits/value: x = d * (q - 8)
  uint16_t d;
  uint8_t qs[QK / 2];  // element j: low nibble of qs[j]; element j+16: high nibble
};
static_assert(sizeof(BlockQ4_0) == 18);

struct BlockQ4_1 {  // 5 bits/value: x = d * q + m
  uint16_t d, m;
  uint8_t qs[QK / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

struct BlockQ5_0 {  // 5.5 bits/value: x = d * (q - 16), q's 5th bit from qh
  uint16_t d;
  uint8_t qh[4];  // bit j of the little-endian uint32: high bit of element j
  uint8_t qs[QK / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

struct BlockQ5_1 {  // 6 bits/value: x = d * q + m
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[QK / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

struct BlockQ8_0 {  // 8.5 bits/value: x = d * q
  uint16_t d;
  int8_t qs[QK];
};
static_assert(sizeof(BlockQ8_0) == 34);

struct BlockQ2_K {            // 2.625 bits/value: 16 sub-blocks of 16, 4-bit scale and min each
  uint8_t scales[QK_K / 16];  // low nibble: scale, high nibble: min
  uint8_t qs[QK_K / 4];
  uint16_t d, dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

struct BlockQ3_K {          // 3.4375 bits/value: 16 sub-blocks of 16, 6-bit signed scales
  uint8_t hmask[QK_K / 8];  // third bit of each value
  uint8_t qs[QK_K / 4];     // low two bits
  uint8_t scales[12];       // sixteen 6-bit scales, offset by 32
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

struct BlockQ4_K {  // 4.5 bits/value: 8 sub-blocks of 32, 6-bit scale and min each
  uint16_t d, dmin;
  uint8_t scales[12];  // packed 6-bit scales and mins (see scale_min_k4)
  uint8_t qs[QK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

struct BlockQ5_K {  // 5.5 bits/value: as Q4_K plus a fifth bit per value
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

struct BlockQ6_K {  // 6.5625 bits/value: 16 sub-blocks of 16, int8 scales, x = d * sc * (q - 32)
  uint8_t ql[QK_K / 2];  // low four bits
  uint8_t qh[QK_K / 4];  // high two bits
  int8_t scales[QK_K / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

template <typename B>
B load_block(const uint8_t* p) {
  B b;
  std::memcpy(&b, p, sizeof b);
  return b;
}

float h2f(uint16_t h) { return half_bits_to_float(h); }

void deq_q4_0(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ4_0>(p);
  const float d = h2f(b.d);
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = d * static_cast<float>((b.qs[j] & 0x0f) - 8);
    y[j + QK / 2] = d * static_cast<float>((b.qs[j] >> 4) - 8);
  }
}

void deq_q4_1(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ4_1>(p);
  const float d = h2f(b.d), m = h2f(b.m);
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = d * static_cast<float>(b.qs[j] & 0x0f) + m;
    y[j + QK / 2] = d * static_cast<float>(b.qs[j] >> 4) + m;
  }
}

template <typename B>
void q5_codes(const B& b, int* q) {  // the 32 five-bit codes of a Q5_0 / Q5_1 block
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < QK / 2; ++j) {
    q[j] = (b.qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    q[j + QK / 2] = (b.qs[j] >> 4) | static_cast<int>(((qh >> (j + QK / 2)) & 1u) << 4);
  }
}

void deq_q5_0(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ5_0>(p);
  int q[QK];
  q5_codes(b, q);
  const float d = h2f(b.d);
  for (int j = 0; j < QK; ++j) y[j] = d * static_cast<float>(q[j] - 16);
}

void deq_q5_1(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ5_1>(p);
  int q[QK];
  q5_codes(b, q);
  const float d = h2f(b.d), m = h2f(b.m);
  for (int j = 0; j < QK; ++j) y[j] = d * static_cast<float>(q[j]) + m;
}

void deq_q8_0(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ8_0>(p);
  const float d = h2f(b.d);
  for (int j = 0; j < QK; ++j) y[j] = d * static_cast<float>(b.qs[j]);
}

void deq_q2_k(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ2_K>(p);
  const float d = h2f(b.d), dmin = h2f(b.dmin);
  int is = 0;
  // Two halves of 128 values; each reads 32 bytes of qs four times, two bits at a time.
  for (int half = 0; half < 2; ++half) {
    const uint8_t* q = b.qs + 32 * half;
    for (int shift = 0; shift < 8; shift += 2) {
      for (int part = 0; part < 2; ++part) {
        const uint8_t sc = b.scales[is++];
        const float dl = d * static_cast<float>(sc & 0x0f), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>((q[l + 16 * part] >> shift) & 3) - ml;
      }
    }
  }
}

void deq_q3_k(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ3_K>(p);
  const float d = h2f(b.d);
  // Sixteen 6-bit scales: low nibbles in bytes 0..7, high two bits in bytes 8..11.
  int scales[16];
  for (int i = 0; i < 16; ++i) {
    const int lo = (i < 8) ? (b.scales[i] & 0x0f) : (b.scales[i - 8] >> 4);
    const int hi = (b.scales[8 + (i % 4)] >> (2 * (i / 4))) & 3;
    scales[i] = (lo | (hi << 4)) - 32;
  }
  int is = 0;
  uint8_t m = 1;
  for (int half = 0; half < 2; ++half) {
    const uint8_t* q = b.qs + 32 * half;
    for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1)) {
      for (int part = 0; part < 2; ++part) {
        const float dl = d * static_cast<float>(scales[is++]);
        for (int l = 0; l < 16; ++l) {
          const int k = l + 16 * part;
          const int code = ((q[k] >> shift) & 3) - ((b.hmask[k] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(code);
        }
      }
    }
  }
}

// Scale and min of sub-block j (0..7) of a Q4_K / Q5_K block: 6 bits each, packed in 12 bytes.
void scale_min_k4(int j, const uint8_t* s, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void deq_q4_k(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ4_K>(p);
  const float d = h2f(b.d), dmin = h2f(b.dmin);
  // Four chunks of 64 values; chunk c uses qs[32c .. 32c+31]: low nibbles, then high nibbles.
  for (int c = 0; c < 4; ++c) {
    const uint8_t* q = b.qs + 32 * c;
    for (int h = 0; h < 2; ++h) {
      int sc, mn;
      scale_min_k4(2 * c + h, b.scales, &sc, &mn);
      const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(mn);
      for (int l = 0; l < 32; ++l) *y++ = dl * static_cast<float>((q[l] >> (4 * h)) & 0x0f) - ml;
    }
  }
}

void deq_q5_k(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ5_K>(p);
  const float d = h2f(b.d), dmin = h2f(b.dmin);
  for (int c = 0; c < 4; ++c) {
    const uint8_t* q = b.qs + 32 * c;
    for (int h = 0; h < 2; ++h) {
      int sc, mn;
      scale_min_k4(2 * c + h, b.scales, &sc, &mn);
      const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(mn);
      const int bit = 2 * c + h;  // sub-block k takes its fifth bit from bit k of qh[l]
      for (int l = 0; l < 32; ++l) {
        const int code = ((q[l] >> (4 * h)) & 0x0f) | (((b.qh[l] >> bit) & 1) << 4);
        *y++ = dl * static_cast<float>(code) - ml;
      }
    }
  }
}

void deq_q6_k(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ6_K>(p);
  const float d = h2f(b.d);
  // Two halves of 128 values; half h uses ql[64h ..], qh[32h ..], scales[8h ..].
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    const int8_t* sc = b.scales + 8 * h;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[128 * h + l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
      y[128 * h + l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[128 * h + l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[128 * h + l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

template <typename T>
void deq_plain(const uint8_t* p, float* y) {
  T v;
  std::memcpy(&v, p, sizeof v);
  y[0] = static_cast<float>(v);
}
void deq_f16(const uint8_t* p, float* y) { y[0] = h2f(load_block<uint16_t>(p)); }
void deq_bf16(const uint8_t* p, float* y) { y[0] = bf16_bits_to_float(load_block<uint16_t>(p)); }

using BlockFn = void (*)(const uint8_t*, float*);

struct TypeEntry {
  uint32_t id;
  TypeTraits traits;
  BlockFn fn;  // decodes one block; nullptr: no decoder
};

// Block sizes as in ggml's type_traits (ggml.c), cross-checked against GGML_QUANT_SIZES of the
// gguf Python package 0.19.0 (which still lists Q8_1 at its old 40 bytes). Entries without a
// decoder still let a file that holds such tensors be opened and its other tensors read; Q8_1
// and Q8_K are the in-memory formats of ggml's dot products, not meant to be stored.
// clang-format off
constexpr TypeEntry kTypes[] = {
    {0,   {"F32",     1,     4,    true},  deq_plain<float>},
    {1,   {"F16",     1,     2,    true},  deq_f16},
    {2,   {"Q4_0",    QK,    18,   true},  deq_q4_0},
    {3,   {"Q4_1",    QK,    20,   true},  deq_q4_1},
    {6,   {"Q5_0",    QK,    22,   true},  deq_q5_0},
    {7,   {"Q5_1",    QK,    24,   true},  deq_q5_1},
    {8,   {"Q8_0",    QK,    34,   true},  deq_q8_0},
    {9,   {"Q8_1",    QK,    36,   false}, nullptr},
    {10,  {"Q2_K",    QK_K,  84,   true},  deq_q2_k},
    {11,  {"Q3_K",    QK_K,  110,  true},  deq_q3_k},
    {12,  {"Q4_K",    QK_K,  144,  true},  deq_q4_k},
    {13,  {"Q5_K",    QK_K,  176,  true},  deq_q5_k},
    {14,  {"Q6_K",    QK_K,  210,  true},  deq_q6_k},
    {15,  {"Q8_K",    QK_K,  292,  false}, nullptr},
    {16,  {"IQ2_XXS", QK_K,  66,   false}, nullptr},
    {17,  {"IQ2_XS",  QK_K,  74,   false}, nullptr},
    {18,  {"IQ3_XXS", QK_K,  98,   false}, nullptr},
    {19,  {"IQ1_S",   QK_K,  50,   false}, nullptr},
    {20,  {"IQ4_NL",  QK,    18,   false}, nullptr},
    {21,  {"IQ3_S",   QK_K,  110,  false}, nullptr},
    {22,  {"IQ2_S",   QK_K,  82,   false}, nullptr},
    {23,  {"IQ4_XS",  QK_K,  136,  false}, nullptr},
    {24,  {"I8",      1,     1,    true},  deq_plain<int8_t>},
    {25,  {"I16",     1,     2,    true},  deq_plain<int16_t>},
    {26,  {"I32",     1,     4,    true},  deq_plain<int32_t>},
    {27,  {"I64",     1,     8,    true},  deq_plain<int64_t>},
    {28,  {"F64",     1,     8,    true},  deq_plain<double>},
    {29,  {"IQ1_M",   QK_K,  56,   false}, nullptr},
    {30,  {"BF16",    1,     2,    true},  deq_bf16},
    {34,  {"TQ1_0",   QK_K,  54,   false}, nullptr},
    {35,  {"TQ2_0",   QK_K,  66,   false}, nullptr},
    {39,  {"MXFP4",   QK,    17,   false}, nullptr},
    {40,  {"NVFP4",   64,    36,   false}, nullptr},
    {41,  {"Q1_0",    128,   18,   false}, nullptr},
};
// clang-format on

const TypeEntry* find_type(uint32_t id) {
  for (const auto& e : kTypes)
    if (e.id == id) return &e;
  return nullptr;
}

// Fixed byte size of a scalar value type; 0 for string, array and unknown numbers.
uint64_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::kFloat64); }

// Bounds-checked little-endian reader over the file bytes.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const std::string& file) : p_(p), n_(n), file_(file) {}
  size_t pos() const { return pos_; }
  uint64_t left() const { return n_ - pos_; }
  const std::string& file() const { return file_; }

  const uint8_t* take(uint64_t k, std::string_view what) {
    if (k > left())
      fail("{}: truncated at byte {} reading {} ({} bytes needed, {} left)", file_, pos_, what, k,
           left());
    const uint8_t* r = p_ + pos_;
    pos_ += k;
    return r;
  }
  template <typename T>
  T read(std::string_view what) {
    T v;
    std::memcpy(&v, take(sizeof v, what), sizeof v);
    return v;
  }
  std::string_view read_string(std::string_view what) {
    const auto len = read<uint64_t>(what);
    if (len > left())
      fail("{}: {} has string length {} but only {} bytes remain", file_, what, len, left());
    return {reinterpret_cast<const char*>(take(len, what)), static_cast<size_t>(len)};
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& file_;
};

Value read_value(Reader& r, ValueType type, const std::string& what, int depth);

// Element type and count of an array, then its elements.
void read_array(Reader& r, Value& v, const std::string& what, int depth) {
  const auto et = r.read<uint32_t>(what);
  if (!known_value_type(et))
    fail("{}: {} is an array of unknown value type {}", r.file(), what, et);
  v.elem_type = static_cast<ValueType>(et);
  v.count = r.read<uint64_t>(what);
  const uint64_t es = scalar_size(v.elem_type);
  const uint64_t min_bytes = es                                  ? es
                             : v.elem_type == ValueType::kString ? kMinStringBytes
                                                                 : kMinArrayBytes;
  if (v.count > r.left() / min_bytes)
    fail("{}: {} has array count {} larger than the {} bytes remaining", r.file(), what, v.count,
         r.left());
  if (es) {
    const uint8_t* p = r.take(v.count * es, what);
    v.raw = {reinterpret_cast<const char*>(p), static_cast<size_t>(v.count * es)};
    if (v.elem_type == ValueType::kBool)
      for (uint64_t i = 0; i < v.count; ++i)
        if (p[i] > 1) fail("{}: {} element {} is bool {}, not 0 or 1", r.file(), what, i, p[i]);
  } else if (v.elem_type == ValueType::kString) {
    v.strings.reserve(v.count);
    for (uint64_t i = 0; i < v.count; ++i) v.strings.push_back(r.read_string(what));
  } else {
    if (depth + 1 >= kMaxArrayDepth)
      fail("{}: {} nests arrays deeper than {}", r.file(), what, kMaxArrayDepth);
    v.arrays.reserve(v.count);
    for (uint64_t i = 0; i < v.count; ++i)
      v.arrays.push_back(read_value(r, ValueType::kArray, what, depth + 1));
  }
}

Value read_value(Reader& r, ValueType type, const std::string& what, int depth) {
  Value v;
  v.type = type;
  if (const uint64_t s = scalar_size(type)) {
    std::memcpy(&v.bits, r.take(s, what), s);
    if (type == ValueType::kBool && v.bits > 1)
      fail("{}: {} is bool {}, not 0 or 1", r.file(), what, v.bits);
  } else if (type == ValueType::kString) {
    v.str = r.read_string(what);
  } else {
    read_array(r, v, what, depth);
  }
  return v;
}

bool is_integer(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kUint16:
    case ValueType::kInt16:
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kUint64:
    case ValueType::kInt64:
      return true;
    default:
      return false;
  }
}

// Any integer value widened to 128 bits, so every range check is exact.
__int128 integer_of(ValueType t, uint64_t bits) {
  switch (t) {
    case ValueType::kInt8:
      return static_cast<int8_t>(bits);
    case ValueType::kInt16:
      return static_cast<int16_t>(bits);
    case ValueType::kInt32:
      return static_cast<int32_t>(bits);
    case ValueType::kInt64:
      return static_cast<int64_t>(bits);
    default:
      return static_cast<__int128>(bits);
  }
}

double float_of(ValueType t, uint64_t bits) {
  if (t == ValueType::kFloat32) return bits_float(static_cast<uint32_t>(bits));
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

std::string int128_str(__int128 v) {
  return v < 0 ? fmt::format("-{}", static_cast<uint64_t>(-v))
               : fmt::format("{}", static_cast<uint64_t>(v));
}

template <typename T>
T checked_int(const std::string& file, std::string_view key, ValueType t, uint64_t bits) {
  const __int128 v = integer_of(t, bits);
  if (v < static_cast<__int128>(std::numeric_limits<T>::min()) ||
      v > static_cast<__int128>(std::numeric_limits<T>::max()))
    fail("{}: metadata '{}' = {} does not fit the requested integer type", file, key,
         int128_str(v));
  return static_cast<T>(v);
}

struct FileMapping {
  void* addr = nullptr;
  size_t len = 0;
  ~FileMapping() {
    if (addr) ::munmap(addr, len);
  }
};

}  // namespace

std::string value_type_name(ValueType t) {
  static const char* const kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                       "int32",  "float32", "bool",   "string", "array",
                                       "uint64", "int64",   "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(kNames) ? kNames[i] : fmt::format("type {}", i);
}

const TypeTraits* type_traits(uint32_t type) {
  const TypeEntry* e = find_type(type);
  return e ? &e->traits : nullptr;
}

std::string ggml_type_name(uint32_t type) {
  const TypeTraits* t = type_traits(type);
  return t ? fmt::format("{} ({})", t->name, type) : fmt::format("unknown ({})", type);
}

void dequantize_row(GgmlType type, const uint8_t* src, int64_t n, float* dst) {
  const TypeEntry* e = find_type(static_cast<uint32_t>(type));
  if (!e) fail("dequantize: unknown ggml type {}", static_cast<uint32_t>(type));
  if (!e->fn)
    fail("dequantize: ggml type {} has no decoder", ggml_type_name(static_cast<uint32_t>(type)));
  const int64_t be = e->traits.block_elems, bb = e->traits.block_bytes;
  if (n < 0 || n % be != 0)
    fail("dequantize: {} values of {} are not whole blocks of {}", n, e->traits.name, be);
  for (int64_t i = 0; i < n / be; ++i) e->fn(src + i * bb, dst + i * be);
}

GgufFile GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open GGUF file ({})", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("{}: cannot stat GGUF file ({})", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  auto map = std::make_shared<FileMapping>();
  map->len = static_cast<size_t>(st.st_size);
  if (map->len > 0) {
    void* a = ::mmap(nullptr, map->len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (a == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail("{}: cannot mmap GGUF file ({})", path, std::strerror(err));
    }
    map->addr = a;
  }
  ::close(fd);
  GgufFile f;
  f.name_ = path;
  f.data_ = static_cast<const uint8_t*>(map->addr);
  f.size_ = map->len;
  f.owner_ = std::move(map);
  f.parse_all();
  return f;
}

GgufFile GgufFile::parse(std::string bytes, const std::string& name) {
  auto s = std::make_shared<std::string>(std::move(bytes));
  GgufFile f;
  f.name_ = name;
  f.data_ = reinterpret_cast<const uint8_t*>(s->data());
  f.size_ = s->size();
  f.owner_ = std::move(s);
  f.parse_all();
  return f;
}

void GgufFile::parse_all() {
  Reader r(data_, size_, name_);
  if (size_ < 4 || std::memcmp(data_, "GGUF", 4) != 0) {
    std::string got;
    for (size_t i = 0; i < std::min<size_t>(size_, 4); ++i) got += fmt::format("{:02x}", data_[i]);
    fail("{}: not a GGUF file (magic bytes {}, expected 47475546 \"GGUF\")", name_,
         got.empty() ? "missing" : got);
  }
  r.take(4, "magic");
  version_ = r.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    if (version_ != 0 && (version_ & 0xffffu) == 0)
      fail("{}: big-endian GGUF (version field {:#010x}) is not supported", name_, version_);
    if (version_ == 1) fail("{}: GGUF version 1 is not supported (2 and 3 are)", name_);
    fail("{}: unsupported GGUF version {} (2 and 3 are supported)", name_, version_);
  }
  const auto tensor_count = r.read<uint64_t>("tensor_count");
  const auto kv_count = r.read<uint64_t>("metadata_kv_count");
  if (kv_count > r.left() / kMinKvBytes)
    fail("{}: absurd metadata_kv_count {} for the {} bytes remaining", name_, kv_count, r.left());

  kv_.reserve(kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    const std::string key(r.read_string(fmt::format("metadata key #{}", i)));
    if (key.empty()) fail("{}: metadata key #{} is empty", name_, i);
    const std::string what = fmt::format("metadata '{}'", key);
    const auto type = r.read<uint32_t>(what);
    if (!known_value_type(type)) fail("{}: {} has unknown value type {}", name_, what, type);
    Value v = read_value(r, static_cast<ValueType>(type), what, 0);
    if (!kv_index_.emplace(key, kv_.size()).second)
      fail("{}: duplicate metadata key '{}'", name_, key);
    kv_.emplace_back(key, std::move(v));
  }

  if (const Value* a = find("general.alignment")) {
    if (a->type != ValueType::kUint32)
      fail("{}: metadata 'general.alignment' has type {}, expected uint32", name_,
           value_type_name(a->type));
    if (a->bits == 0 || (a->bits & (a->bits - 1)) != 0)
      fail("{}: metadata 'general.alignment' = {} is not a power of two", name_, a->bits);
    alignment_ = a->bits;
  } else {
    alignment_ = kDefaultAlignment;
  }

  if (tensor_count > r.left() / kMinTensorInfoBytes)
    fail("{}: absurd tensor_count {} for the {} bytes remaining", name_, tensor_count, r.left());
  tensors_.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorInfo t;
    t.name = std::string(r.read_string(fmt::format("tensor #{} name", i)));
    const std::string what = fmt::format("tensor '{}'", t.name);
    const auto n_dims = r.read<uint32_t>(what);
    if (n_dims > kMaxDims) fail("{}: {} has n_dims {} (at most {})", name_, what, n_dims, kMaxDims);
    int64_t n = 1;
    bool overflow = false;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto ne = r.read<uint64_t>(what);
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail("{}: {} dimension {} = {} is out of range", name_, what, d, ne);
      t.dims.push_back(static_cast<int64_t>(ne));
      overflow = overflow || __builtin_mul_overflow(n, static_cast<int64_t>(ne), &n);
    }
    if (overflow)
      fail("{}: {} dims [{}] overflow the element count", name_, what, fmt::join(t.dims, ", "));
    t.nelements = n;
    const auto type = r.read<uint32_t>(what);
    const TypeTraits* tr = type_traits(type);
    if (!tr) fail("{}: {} has unknown ggml type {}", name_, what, type);
    t.type = static_cast<GgmlType>(type);
    const int64_t ne0 = t.dims.empty() ? 1 : t.dims[0];
    if (ne0 % tr->block_elems != 0)
      fail("{}: {} row length ne[0] = {} is not a multiple of the {} block size {}", name_, what,
           ne0, tr->name, tr->block_elems);
    int64_t nb = 0;
    if (__builtin_mul_overflow(n / tr->block_elems, tr->block_bytes, &nb))
      fail("{}: {} byte size overflows (dims [{}], {})", name_, what, fmt::join(t.dims, ", "),
           tr->name);
    t.nbytes = static_cast<uint64_t>(nb);
    t.offset = r.read<uint64_t>(what);
    if (!tensor_index_.emplace(t.name, tensors_.size()).second)
      fail("{}: duplicate tensor name '{}'", name_, t.name);
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment (pos <= size_, no overflow).
  const uint64_t pos = r.pos();
  data_offset_ = (pos + alignment_ - 1) / alignment_ * alignment_;
  for (const TensorInfo& t : tensors_) {
    if (t.offset % alignment_ != 0)
      fail("{}: tensor '{}' data offset {} is not a multiple of the alignment {}", name_, t.name,
           t.offset, alignment_);
    uint64_t begin = 0, end = 0;
    if (__builtin_add_overflow(data_offset_, t.offset, &begin) ||
        __builtin_add_overflow(begin, t.nbytes, &end) || end > size_)
      fail(
          "{}: tensor '{}' data (offset {}, {} bytes, data section at {}) lies outside the file "
          "({} bytes)",
          name_, t.name, t.offset, t.nbytes, data_offset_, size_);
  }
}

const Value* GgufFile::find(std::string_view key) const {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const Value& GgufFile::get(std::string_view key) const {
  const Value* v = find(key);
  if (!v) fail("{}: missing metadata key '{}'", name_, key);
  return *v;
}

namespace {

const Value& typed(const std::string& file, std::string_view key, const Value& v, bool ok,
                   std::string_view expected) {
  if (!ok)
    fail("{}: metadata '{}' has type {}, expected {}", file, key,
         v.type == ValueType::kArray ? "array of " + value_type_name(v.elem_type)
                                     : value_type_name(v.type),
         expected);
  return v;
}

}  // namespace

uint32_t GgufFile::get_u32(std::string_view key) const {
  const Value& v = get(key);
  typed(name_, key, v, is_integer(v.type), "an integer");
  return checked_int<uint32_t>(name_, key, v.type, v.bits);
}

int32_t GgufFile::get_i32(std::string_view key) const {
  const Value& v = get(key);
  typed(name_, key, v, is_integer(v.type), "an integer");
  return checked_int<int32_t>(name_, key, v.type, v.bits);
}

uint64_t GgufFile::get_u64(std::string_view key) const {
  const Value& v = get(key);
  typed(name_, key, v, is_integer(v.type), "an integer");
  return checked_int<uint64_t>(name_, key, v.type, v.bits);
}

int64_t GgufFile::get_i64(std::string_view key) const {
  const Value& v = get(key);
  typed(name_, key, v, is_integer(v.type), "an integer");
  return checked_int<int64_t>(name_, key, v.type, v.bits);
}

double GgufFile::get_f64(std::string_view key) const {
  const Value& v = get(key);
  typed(name_, key, v, v.type == ValueType::kFloat32 || v.type == ValueType::kFloat64, "a float");
  return float_of(v.type, v.bits);
}

float GgufFile::get_f32(std::string_view key) const { return static_cast<float>(get_f64(key)); }

bool GgufFile::get_bool(std::string_view key) const {
  const Value& v = get(key);
  typed(name_, key, v, v.type == ValueType::kBool, "bool");
  return v.bits != 0;
}

std::string GgufFile::get_string(std::string_view key) const {
  const Value& v = get(key);
  typed(name_, key, v, v.type == ValueType::kString, "string");
  return std::string(v.str);
}

uint64_t GgufFile::array_size(std::string_view key) const {
  const Value& v = get(key);
  typed(name_, key, v, v.type == ValueType::kArray, "an array");
  return v.count;
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  const Value& v = get(key);
  typed(name_, key, v, v.type == ValueType::kArray && v.elem_type == ValueType::kString,
        "array of string");
  return {v.strings.begin(), v.strings.end()};
}

std::vector<int32_t> GgufFile::get_i32_array(std::string_view key) const {
  const Value& v = get(key);
  typed(name_, key, v, v.type == ValueType::kArray && is_integer(v.elem_type), "array of integers");
  const uint64_t es = scalar_size(v.elem_type);
  std::vector<int32_t> out;
  out.reserve(v.count);
  for (uint64_t i = 0; i < v.count; ++i) {
    uint64_t bits = 0;
    std::memcpy(&bits, v.raw.data() + i * es, es);
    out.push_back(checked_int<int32_t>(name_, key, v.elem_type, bits));
  }
  return out;
}

std::vector<float> GgufFile::get_f32_array(std::string_view key) const {
  const Value& v = get(key);
  typed(name_, key, v,
        v.type == ValueType::kArray &&
            (v.elem_type == ValueType::kFloat32 || v.elem_type == ValueType::kFloat64),
        "array of float");
  const uint64_t es = scalar_size(v.elem_type);
  std::vector<float> out;
  out.reserve(v.count);
  for (uint64_t i = 0; i < v.count; ++i) {
    uint64_t bits = 0;
    std::memcpy(&bits, v.raw.data() + i * es, es);
    out.push_back(static_cast<float>(float_of(v.elem_type, bits)));
  }
  return out;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& GgufFile::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (!t) fail("{}: no tensor named '{}'", name_, name);
  return *t;
}

std::span<const uint8_t> GgufFile::tensor_data(const TensorInfo& t) const {
  return {data_ + data_offset_ + t.offset, static_cast<size_t>(t.nbytes)};
}

std::vector<float> GgufFile::dequantize(const TensorInfo& t) const {
  const TypeTraits* tr = type_traits(static_cast<uint32_t>(t.type));
  if (!tr->dequantizable)
    fail("{}: tensor '{}' has ggml type {}, which this reader cannot dequantize", name_, t.name,
         ggml_type_name(static_cast<uint32_t>(t.type)));
  std::vector<float> out(static_cast<size_t>(t.nelements));
  dequantize_row(t.type, tensor_data(t).data(), t.nelements, out.data());
  return out;
}

}  // namespace kvq::gguf
