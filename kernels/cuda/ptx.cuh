// Backend cuda: the PTX wrappers the tensor-core kernels share (attention_mma.cu's decode
// kernels, model_kernels.cu's GEMM): cp.async copies into shared memory, ldmatrix, a 16-byte
// shared load, and mma.sync.m16n8k16 with fp32 accumulators. One definition each; device code only.
#pragma once

#include <cstdint>

namespace kvq::cuda::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16 bytes global -> shared, asynchronously, through L2 only; src_bytes 0 zero-fills the
/// destination.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}
/// N (4, 8 or 16) bytes global -> shared, asynchronously (16: through L2 only, as cp_async16).
template <int N>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool in) {
  if constexpr (N == 16) {
    cp_async16(dst, src, in ? 16 : 0);
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "n"(N), "r"(in ? N : 0));
  }
}
/// 16 bytes from shared address a, as one ld.shared (volatile: not moved across the barriers
/// before it; the int decode kernel reads its loops' constant mma operands so, once a tile).
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(a));
  return v;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

/// c += A B (m16n8k16, fp32 accumulators; bf16 inputs, or fp16 where !kBf16).
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
#define KVQ_MMA_16816(T)                                                                \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T                         \
               ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n" \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
  if constexpr (kBf16)
    KVQ_MMA_16816("bf16");
  else
    KVQ_MMA_16816("f16");
#undef KVQ_MMA_16816
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  mma_16816<true>(c, a, b0, b1);
}
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  mma_16816<false>(c, a, b0, b1);
}

}  // namespace kvq::cuda::ptx
