// Plain scalar versions of every kernel in kernels.h: the test oracle. Clarity over speed; every
// reduction accumulates in double.
#pragma once

#include "kernels/kernels.h"

namespace moe::kernels::ref {

void Matmul(const float* x, int64_t m, const Weight& w, float* y);
void QuantizeRows(const float* x, int64_t rows, int64_t cols, int8_t* q, float* scales);
void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y);
void SiluMul(const float* gate, const float* up, int64_t n, float* y);
void ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t token_stride, int64_t head_stride,
               const int32_t* positions, const RopeParams& rope);
void Attention(const float* q, const float* k, const float* v, const AttentionParams& p, float* out);
// The softmax is exact (in double) whatever p.rescale says.
void LatentAttention(const float* q_lat, const float* q_pe, const float* c_kv, const float* k_pe,
                     const LatentAttentionParams& p, float* out);
void LatentAttention(const float* q_lat, const float* q_pe, const bf16* c_kv, const bf16* k_pe,
                     const LatentAttentionParams& p, float* out);

}  // namespace moe::kernels::ref
