#include "model/mla.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/kernels.h"

namespace moe {
namespace {

// Copies column block [col, col + width) of each row of a [rows, stride] matrix into dst.
void CopyColumns(const float* src, int64_t rows, int64_t stride, int64_t col, int64_t width, float* dst,
                 int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * dst_stride, src + r * stride + col, width * sizeof(float));
  }
}

// Attention with kv_b applied to every cached latent: q [T, H, nope+rope] -> [T, H, v].
void ExpandedAttention(const AttentionWeights& w, const ModelConfig& c, const float* q, int64_t tokens,
                       int64_t start, const LayerKvCache& cache, float* out) {
  const int64_t heads = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t vdim = c.v_head_dim, keys = start + tokens, qk = nope + rope;
  std::vector<float> kv(keys * heads * (nope + vdim));
  kernels::Matmul(cache.c_kv.data<float>(), keys, w.kv_b.view(), kv.data());
  std::vector<float> k(keys * heads * qk), v(keys * heads * vdim);
  for (int64_t s = 0; s < keys; ++s) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* src = kv.data() + (s * heads + h) * (nope + vdim);
      float* kd = k.data() + (s * heads + h) * qk;
      std::memcpy(kd, src, nope * sizeof(float));
      std::memcpy(kd + nope, cache.k_pe.data<float>() + s * rope, rope * sizeof(float));
      std::memcpy(v.data() + (s * heads + h) * vdim, src + nope, vdim * sizeof(float));
    }
  }
  kernels::AttentionParams p{tokens, keys, heads, qk, vdim, start, static_cast<float>(c.SoftmaxScale())};
  kernels::Attention(q, k.data(), v.data(), p, out);
}

// Attention on the latent cache: fold W_uk into the query and W_uv into the output.
void AbsorbedAttention(const AttentionWeights& w, const ModelConfig& c, const float* q, int64_t tokens,
                       int64_t start, const LayerKvCache& cache, float* out) {
  const int64_t heads = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t vdim = c.v_head_dim, lora = c.kv_lora_rank, qk = nope + rope;
  std::vector<float> q_lat(tokens * heads * lora), q_pe(tokens * heads * rope);
  std::vector<float> head_in(tokens * std::max(nope, lora)), head_out(tokens * std::max(lora, vdim));
  for (int64_t h = 0; h < heads; ++h) {
    CopyColumns(q, tokens, heads * qk, h * qk, nope, head_in.data(), nope);
    kernels::Matmul(head_in.data(), tokens, w.k_absorb[h].view(), head_out.data());
    CopyColumns(head_out.data(), tokens, lora, 0, lora, q_lat.data() + h * lora, heads * lora);
    CopyColumns(q, tokens, heads * qk, h * qk + nope, rope, q_pe.data() + h * rope, heads * rope);
  }
  std::vector<float> o_lat(tokens * heads * lora);
  kernels::LatentAttentionParams p{tokens, start + tokens, heads, lora, rope, start,
                                   static_cast<float>(c.SoftmaxScale())};
  kernels::LatentAttention(q_lat.data(), q_pe.data(), cache.c_kv.data<float>(), cache.k_pe.data<float>(), p,
                           o_lat.data());
  for (int64_t h = 0; h < heads; ++h) {
    CopyColumns(o_lat.data(), tokens, heads * lora, h * lora, lora, head_in.data(), lora);
    kernels::Matmul(head_in.data(), tokens, w.v_absorb[h].view(), head_out.data());
    CopyColumns(head_out.data(), tokens, vdim, 0, vdim, out + h * vdim, heads * vdim);
  }
}

}  // namespace

void MlaForward(const AttentionWeights& w, const ModelConfig& c, const Rope& rope, const float* x,
                int64_t tokens, int64_t start, LayerKvCache& cache, AttentionForm form, float* out) {
  MOE_CHECK(start + tokens <= cache.c_kv.dim(0), "latent cache overflow: %lld + %lld > %lld",
            static_cast<long long>(start), static_cast<long long>(tokens),
            static_cast<long long>(cache.c_kv.dim(0)));
  const int64_t heads = c.num_attention_heads, qk = c.qk_head_dim(), lora = c.kv_lora_rank;
  const int64_t rope_dim = c.qk_rope_head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<int32_t> positions(tokens);
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(start));

  std::vector<float> q(tokens * heads * qk);
  if (c.q_lora_rank) {
    std::vector<float> q_latent(tokens * *c.q_lora_rank);
    kernels::Matmul(x, tokens, w.q_a.view(), q_latent.data());
    kernels::RmsNorm(q_latent.data(), w.q_a_norm.data<float>(), tokens, *c.q_lora_rank, eps, q_latent.data());
    kernels::Matmul(q_latent.data(), tokens, w.q_b.view(), q.data());
  } else {
    kernels::Matmul(x, tokens, w.q_proj.view(), q.data());
  }
  kernels::ApplyRope(q.data() + c.qk_nope_head_dim, tokens, heads, heads * qk, qk, positions.data(),
                     rope.params());

  std::vector<float> kv(tokens * (lora + rope_dim));
  kernels::Matmul(x, tokens, w.kv_a.view(), kv.data());
  float* c_kv = cache.c_kv.data<float>() + start * lora;
  float* k_pe = cache.k_pe.data<float>() + start * rope_dim;
  CopyColumns(kv.data(), tokens, lora + rope_dim, 0, lora, c_kv, lora);
  CopyColumns(kv.data(), tokens, lora + rope_dim, lora, rope_dim, k_pe, rope_dim);
  kernels::RmsNorm(c_kv, w.kv_a_norm.data<float>(), tokens, lora, eps, c_kv);
  kernels::ApplyRope(k_pe, tokens, 1, rope_dim, rope_dim, positions.data(), rope.params());

  std::vector<float> attn(tokens * heads * c.v_head_dim);
  if (form == AttentionForm::kExpanded) {
    ExpandedAttention(w, c, q.data(), tokens, start, cache, attn.data());
  } else {
    AbsorbedAttention(w, c, q.data(), tokens, start, cache, attn.data());
  }
  kernels::Matmul(attn.data(), tokens, w.o_proj.view(), out);
}

}  // namespace moe
