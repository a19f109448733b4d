// Uses an installed kvq (find_package(kvq)): a KIVI-2 cache of one layer, streamed in chunks,
// attended over its codes by the SIMD backend and by the reference; prints both and the bytes
// stored, and exits nonzero if the backends disagree beyond the documented tolerance.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cache/side.h"
#include "core/spec.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kivi.h"
#include "reference_cpu/attention.h"

int main() {
  const int64_t T = 512, H = 2, D = 64, QH = 8;
  const kvq::SchemeSpec spec = kvq::parse_spec("kivi2");
  kvq::SideKernels kernels;
  kernels.kivi = kvq::cpu::kivi_group_quantizers();
  auto k = kvq::make_side(spec, kvq::Role::Key, H, D, 0, kernels);
  auto v = kvq::make_side(spec, kvq::Role::Value, H, D, 0, kernels);

  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  std::vector<float> kx(T * H * D), vx(T * H * D), q(QH * D);
  for (auto& x : kx) x = normal(gen);
  for (auto& x : vx) x = normal(gen);
  for (auto& x : q) x = normal(gen);
  for (int64_t t = 0; t < T; t += 128) {  // a prefill in four chunks
    k->append(kx.data() + t * H * D, 128);
    v->append(vx.data() + t * H * D, 128);
  }

  std::vector<float> fast(QH * D), ref(QH * D);
  kvq::cpu::decode_attention(q.data(), QH, k->stored(), v->stored(), fast.data());
  kvq::decode_attention(q.data(), QH, *k, *v, ref.data());
  double diff = 0, vmax = 0;
  for (size_t i = 0; i < fast.size(); ++i) diff = std::fmax(diff, std::fabs(fast[i] - ref[i]));
  for (float x : vx) vmax = std::fmax(vmax, std::fabs(x));
  const kvq::Footprint fk = k->footprint();
  std::printf(
      "%s: %lld tokens, keys %.3f bits per element, o[0] cpu %.6f ref %.6f, max diff %.2e\n",
      spec.canonical().c_str(), static_cast<long long>(k->tokens()), fk.effective_bits(), fast[0],
      ref[0], diff);
  return diff <= 2e-5 * vmax ? 0 : 1;  // kernels/cpu/attention.h's tolerance
}
