// The whole installed library: a KIVI-2 cache with the model's CPU kernels (kvq::model), attended
// by the SIMD backend (kvq::cpu) and the reference (kvq::reference); exits nonzero if they
// disagree beyond kernels/cpu/attention.h's tolerance. The tokenizer (PCRE2) and, with CUDA, a
// kernel launcher (cudart) are linked but not called.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cache/side.h"
#include "kernels/cpu/attention.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "reference_cpu/attention.h"
#ifdef FULL_CONSUMER_CUDA
#include "kernels/cuda/fp8_kernels.cuh"
#endif

int main() {
  const int64_t T = 256, H = 2, D = 64, QH = 4;
  const kvq::SchemeSpec spec = kvq::parse_spec("kivi2");
  auto k = kvq::make_side(spec, kvq::Role::Key, H, D, 0, kvq::cpu_side_kernels());
  auto v = kvq::make_side(spec, kvq::Role::Value, H, D, 0, kvq::cpu_side_kernels());
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  std::vector<float> kx(T * H * D), vx(T * H * D), q(QH * D);
  for (auto* x : {&kx, &vx, &q})
    for (float& e : *x) e = normal(gen);
  k->append(kx.data(), T);
  v->append(vx.data(), T);

  std::vector<float> fast(QH * D), ref(QH * D);
  kvq::cpu::decode_attention(q.data(), QH, k->stored(), v->stored(), fast.data());
  kvq::decode_attention(q.data(), QH, *k, *v, ref.data());
  double diff = 0, vmax = 0;
  for (size_t i = 0; i < fast.size(); ++i) diff = std::fmax(diff, std::fabs(fast[i] - ref[i]));
  for (float x : vx) vmax = std::fmax(vmax, std::fabs(x));

  auto* volatile tokenizer = &kvq::Tokenizer::from_gguf;
  bool linked = tokenizer != nullptr;
#ifdef FULL_CONSUMER_CUDA
  auto* volatile launcher = &kvq::cuda::fp8_dynamic_scales;
  linked = linked && launcher != nullptr;
#endif
  std::printf("full: %s on backend %s, max diff %.2e\n", spec.canonical().c_str(),
              kvq::to_string(kvq::parse_backend("cpu")), diff);
  return linked && diff <= 2e-5 * vmax ? 0 : 1;  // kernels/cpu/attention.h's tolerance
}
