// Tests for backend cpu's quantize kernels lent to the streaming cache sides (SideKernels in
// cache/side.h, kivi::GroupQuantizers in kivi/cache.h): the same tokens appended in
// the same ragged chunks to a side with the reference's quantizers and to one with backend cpu's
// must store the same bytes after every append - codes / words, scales, minima, the exact tail
// and the dequantized values, compared bit for bit. The expected bytes are the reference's
// (fp8/scale.cpp, kivi/cache.cpp), not the code under test.
#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <string>
#include <vector>

#include "cache/side.h"
#include "core/spec.h"
#include "fp8/scale.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/kivi.h"
#include "kivi/layout.h"
#include "model/llama.h"
#include "tests/kivi/naive.h"
#include "tests/support/stored_counts.h"

namespace kvq::cpu {
namespace {

template <typename T>
void expect_same(const T* a, const T* b, int64_t n, const char* what, int64_t tokens) {
  ASSERT_EQ(a == nullptr, b == nullptr) << what;
  if (n == 0 || a == nullptr) return;
  ASSERT_EQ(std::memcmp(a, b, static_cast<size_t>(n) * sizeof(T)), 0)
      << what << " differ after " << tokens << " tokens";
}

struct Case {
  std::string spec;
  int64_t heads, dim;
};

class cpuSideKernels : public ::testing::TestWithParam<Case> {};

TEST_P(cpuSideKernels, streamingAppend_sameBytesAsReference_afterEveryChunk) {
  const Case c = GetParam();
  const SchemeSpec spec = parse_spec(c.spec);
  const std::vector<int64_t> chunks{5, 1, 1, 17, 40, 1, 3, 64, 2, 33};
  int64_t total = 0;
  for (int64_t n : chunks) total += n;
  const Tensor3 x = kivi::naive::random_kv(total, c.heads, c.dim, 23);
  for (Role role : {Role::Key, Role::Value}) {
    auto ref = make_side(spec, role, c.heads, c.dim, 0);
    auto got = make_side(spec, role, c.heads, c.dim, 0, cpu_side_kernels());
    int64_t t = 0;
    int64_t quantized = 0;
    for (int64_t n : chunks) {
      const float* xc = x.data.data() + t * c.heads * c.dim;
      ref->append(xc, n);
      got->append(xc, n);
      t += n;
      const StoredSide a = ref->stored(), b = got->stored();
      quantized = ref->quantized_tokens_at(t);
      ASSERT_EQ(got->quantized_tokens_at(t), quantized);
      const testing::StoredCounts cnt = testing::stored_counts(a, quantized);
      expect_same(a.codes, b.codes, cnt.codes, "fp8 codes", t);
      expect_same(a.fp8_scales, b.fp8_scales, cnt.scales, "fp8 scales", t);
      expect_same(a.words, b.words, cnt.words, "words", t);
      expect_same(a.scales, b.scales, cnt.params, "scales", t);
      expect_same(a.mins, b.mins, cnt.params, "mins", t);
      std::vector<float> ta, tb;
      ref->exact_tail(ta);
      got->exact_tail(tb);
      ASSERT_EQ(ta.size(), tb.size());
      expect_same(ta.data(), tb.data(), static_cast<int64_t>(ta.size()), "exact tail", t);
    }
    EXPECT_GT(quantized, 0) << "nothing was quantized: the case tests nothing";
    const Tensor3 da = ref->dequantize(), db = got->dequantize();
    ASSERT_EQ(da.data.size(), db.data.size());
    expect_same(da.data.data(), db.data.data(), static_cast<int64_t>(da.data.size()),
                "dequantized values", total);
  }
}

std::string name_of(const ::testing::TestParamInfo<Case>& i) {
  std::string n =
      i.param.spec + "_H" + std::to_string(i.param.heads) + "_D" + std::to_string(i.param.dim);
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Specs, cpuSideKernels,
                         ::testing::Values(Case{"kivi2", 3, 64}, Case{"kivi4:g=8,r=8", 2, 72},
                                           Case{"kivi2:g=32,r=0", 3, 64},
                                           Case{"int3:k=token,v=token,g=16,r=16", 2, 72},
                                           Case{"int8:k=channel,v=channel,g=16,r=32", 2, 64},
                                           Case{"int4:k=token,v=token,g=32", 4, 128},
                                           Case{"fp8_e4m3:gran=token", 3, 64},
                                           Case{"fp8_e5m2:gran=head,first=12", 2, 72},
                                           Case{"fp8_e4m3fnuz:gran=channel,first=5", 3, 64},
                                           Case{"fp8_e4m3:gran=tensor,first=1", 2, 64}),
                         name_of);

}  // namespace
}  // namespace kvq::cpu
