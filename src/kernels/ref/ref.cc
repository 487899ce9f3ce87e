#include "kernels/ref/ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moe::kernels::ref {
namespace {

float WeightAt(const TensorView& w, int64_t i) {
  return w.dtype == DType::kBF16 ? Bf16ToF32(w.as<const bf16>()[i]) : w.as<const float>()[i];
}

// Softmax over scores[0..n) in place, in double.
void SoftmaxInPlace(std::vector<double>& scores) {
  double max = -INFINITY;
  for (double s : scores) max = std::max(max, s);
  double sum = 0;
  for (double& s : scores) sum += (s = std::exp(s - max));
  for (double& s : scores) s /= sum;
}

}  // namespace

void QuantizeRows(const float* x, int64_t rows, int64_t cols, int8_t* q, float* scales) {
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(x[r * cols + c]));
    scales[r] = amax / 127.0f;
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (int64_t c = 0; c < cols; ++c) q[r * cols + c] = static_cast<int8_t>(std::nearbyint(x[r * cols + c] * inv));
  }
}

void Matmul(const float* x, int64_t m, const Weight& weight, float* y) {
  const TensorView& w = weight.data;
  const int64_t n = w.dim(0), k = w.dim(1);
  if (w.dtype == DType::kI8) {
    std::vector<int8_t> qx(m * k);
    std::vector<float> x_scales(m);
    QuantizeRows(x, m, k, qx.data(), x_scales.data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        int32_t acc = 0;
        for (int64_t l = 0; l < k; ++l) acc += qx[i * k + l] * w.as<const int8_t>()[j * k + l];
        y[i * n + j] = static_cast<float>(acc) * x_scales[i] * weight.row_scales[j];
      }
    }
    return;
  }
  const bool bf16_inputs = w.dtype == DType::kBF16;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t l = 0; l < k; ++l) {
        const float a = bf16_inputs ? Bf16ToF32(F32ToBf16(x[i * k + l])) : x[i * k + l];
        acc += static_cast<double>(a) * WeightAt(w, j * k + l);
      }
      y[i * n + j] = static_cast<float>(acc);
    }
  }
}

void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    double sum_sq = 0;
    for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(sum_sq / dim + eps);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = static_cast<float>(x[r * dim + i] * inv * weight[i]);
  }
}

void SiluMul(const float* gate, const float* up, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    y[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t token_stride, int64_t head_stride,
               const int32_t* positions, const RopeParams& rope) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * token_stride + h * head_stride;
      for (int64_t i = 0; i < rope.dim / 2; ++i) {
        const double angle = positions[t] * rope.inv_freq[i];
        const double c = std::cos(angle) * rope.scale, s = std::sin(angle) * rope.scale;
        const double a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = static_cast<float>(a * c - b * s);
        v[2 * i + 1] = static_cast<float>(a * s + b * c);
      }
    }
  }
}

void Attention(const float* q, const float* k, const float* v, const AttentionParams& p, float* out) {
  for (int64_t t = 0; t < p.tokens; ++t) {
    const int64_t visible = p.q_offset + t + 1;
    for (int64_t h = 0; h < p.heads; ++h) {
      std::vector<double> probs(visible);
      // bf16_products: the operands rounded as the kernel rounds them (but not the probabilities).
      auto operand = [&](float x) { return p.bf16_products ? Bf16ToF32(F32ToBf16(x)) : x; };
      const float* qv = q + (t * p.heads + h) * p.qk_dim;
      for (int64_t s = 0; s < visible; ++s) {
        const float* kv = k + (s * p.heads + h) * p.qk_dim;
        double dot = 0;
        for (int64_t i = 0; i < p.qk_dim; ++i) dot += static_cast<double>(operand(qv[i])) * operand(kv[i]);
        probs[s] = dot * p.scale;
      }
      SoftmaxInPlace(probs);
      float* o = out + (t * p.heads + h) * p.v_dim;
      for (int64_t i = 0; i < p.v_dim; ++i) {
        double acc = 0;
        for (int64_t s = 0; s < visible; ++s) acc += probs[s] * operand(v[(s * p.heads + h) * p.v_dim + i]);
        o[i] = static_cast<float>(acc);
      }
    }
  }
}

namespace {

float ToFloat(float x) { return x; }
float ToFloat(bf16 x) { return Bf16ToF32(x); }

template <typename T>
void LatentAttentionImpl(const float* q_lat, const float* q_pe, const T* c_kv, const T* k_pe,
                         const LatentAttentionParams& p, float* out) {
  for (int64_t t = 0; t < p.tokens; ++t) {
    const int64_t visible = p.q_offset + t + 1;
    for (int64_t h = 0; h < p.heads; ++h) {
      const float* ql = q_lat + (t * p.heads + h) * p.kv_lora;
      const float* qp = q_pe + (t * p.heads + h) * p.rope;
      std::vector<double> probs(visible);
      for (int64_t s = 0; s < visible; ++s) {
        const int64_t row = p.CacheRow(s);
        double dot = 0;
        for (int64_t i = 0; i < p.kv_lora; ++i) dot += static_cast<double>(ql[i]) * ToFloat(c_kv[row * p.kv_lora + i]);
        for (int64_t i = 0; i < p.rope; ++i) dot += static_cast<double>(qp[i]) * ToFloat(k_pe[row * p.rope + i]);
        probs[s] = dot * p.scale;
      }
      SoftmaxInPlace(probs);
      float* o = out + (t * p.heads + h) * p.kv_lora;
      for (int64_t i = 0; i < p.kv_lora; ++i) {
        double acc = 0;
        for (int64_t s = 0; s < visible; ++s) acc += probs[s] * ToFloat(c_kv[p.CacheRow(s) * p.kv_lora + i]);
        o[i] = static_cast<float>(acc);
      }
    }
  }
}

}  // namespace

void LatentAttention(const float* q_lat, const float* q_pe, const float* c_kv, const float* k_pe,
                     const LatentAttentionParams& p, float* out) {
  LatentAttentionImpl(q_lat, q_pe, c_kv, k_pe, p, out);
}

void LatentAttention(const float* q_lat, const float* q_pe, const bf16* c_kv, const bf16* k_pe,
                     const LatentAttentionParams& p, float* out) {
  LatentAttentionImpl(q_lat, q_pe, c_kv, k_pe, p, out);
}

}  // namespace moe::kernels::ref
