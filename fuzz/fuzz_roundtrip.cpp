// Quantization on arbitrary float bit patterns (NaN, inf, subnormals, huge values, constant
// groups): the input's first bytes pick a scheme, a shape and the chunking; the rest are float32
// values appended in those chunks to a side with the reference's quantizers and to one with
// backend cpu's (kernels/cpu/). After every append both must store the same bytes - codes,
// scales, minima, the exact tail - and read back the same values, bit for bit. No value may make
// an append throw.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cache/side.h"
#include "core/spec.h"
#include "fuzz/fuzz_util.h"
#include "model/llama.h"
#include "tests/support/stored_counts.h"

namespace {

const char* const kSpecs[] = {
    "fp8_e4m3:gran=tensor", "fp8_e4m3:gran=head", "fp8_e4m3:gran=token", "fp8_e4m3:gran=channel",
    "fp8_e5m2:gran=token", "fp8_e4m3fnuz:gran=head", "fp8_e4m3:gran=tensor,scale=0.5",
    "fp8_e4m3:gran=channel,first=3", "kivi2", "kivi4:g=8,r=16", "kivi8:g=8,r=0",
    "int3:k=channel,v=token,g=8,r=8", "int2:k=token,v=token,g=8", "int4:k=token,v=channel,g=8",
    "int8:k=token,v=token,g=16,sym", "int4:k=channel,v=token,g=8,sym",
    "int2:k=channel,v=token,g=8,arith=fp16", "bf16", "fp16", "fp32"};
const int64_t kDims[] = {8, 16, 24, 32, 64};

template <typename T>
void same(const T* a, const T* b, int64_t n) {
  kvq::fuzz::require((a == nullptr) == (b == nullptr));
  if (a && n > 0) kvq::fuzz::require(std::memcmp(a, b, static_cast<size_t>(n) * sizeof(T)) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvq;
  if (size < 4 + 4) return 0;  // the four choice bytes and at least one value
  const SchemeSpec spec = parse_spec(kSpecs[data[0] % std::size(kSpecs)]);
  const int64_t heads = 1 + data[1] % 3, dim = kDims[data[2] % std::size(kDims)];
  const uint8_t chunk_seed = data[3];
  const int64_t row = heads * dim;
  std::vector<float> x((size - 4) / 4);
  std::memcpy(x.data(), data + 4, x.size() * 4);
  const int64_t tokens = static_cast<int64_t>(x.size()) / row;
  if (tokens == 0) return 0;
  for (Role role : {Role::Key, Role::Value}) {
    std::unique_ptr<SideStore> ref, got;
    try {  // a scheme that does not fit the shape (g=32 over 8 channels) is refused, not a finding
      ref = make_side(spec, role, heads, dim, 0);
      got = make_side(spec, role, heads, dim, 0, cpu_side_kernels());
    } catch (const Error&) {
      continue;
    }
    int64_t t = 0, k = 0;
    while (t < tokens) {
      const int64_t n = std::min<int64_t>(tokens - t, 1 + ((chunk_seed >> (k++ % 8)) & 7) * 3);
      ref->append(x.data() + t * row, n);
      got->append(x.data() + t * row, n);
      t += n;
      const StoredSide a = ref->stored(), b = got->stored();
      const int64_t qt = ref->quantized_tokens_at(t);
      fuzz::require(got->quantized_tokens_at(t) == qt);
      const testing::StoredCounts c = testing::stored_counts(a, qt);
      same(a.codes, b.codes, c.codes);
      same(a.fp8_scales, b.fp8_scales, c.scales);
      same(a.words, b.words, c.words);
      same(a.scales, b.scales, c.params);
      same(a.mins, b.mins, c.params);
      std::vector<float> ta, tb;
      ref->exact_tail(ta);
      got->exact_tail(tb);
      fuzz::require(ta.size() == tb.size());
      same(ta.data(), tb.data(), static_cast<int64_t>(ta.size()));
    }
    const Tensor3 da = ref->dequantize(), db = got->dequantize();
    fuzz::require(da.data.size() == db.data.size());
    same(da.data.data(), db.data.data(), static_cast<int64_t>(da.data.size()));
  }
  return 0;
}
