// The compute kernels the model calls, over plain pointers and small params structs. Every kernel
// here has a scalar twin in kernels/ref that the tests compare against.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace moe::kernels {

// A [n, k] weight matrix: F32, BF16, or I8 with one dequantization scale per row (output channel).
// `packed` and `gemv_packed`, when set, are the same I8 weight as PackMatmulWeight and
// PackGemvWeight lay it out, which Matmul then reads instead of `data`: the first for many rows,
// the second for a few, or for every row count where Int8Gemv and AMX-INT8, or Int8Gemv alone (AVX-VNNI
// on AVX2), serve every batch (NeedsMatmulPacking).
struct Weight {
  Weight(const TensorView& data, const float* row_scales = nullptr,  // NOLINT: implicit by design
         const void* packed = nullptr, const void* gemv_packed = nullptr)
      : data(data), row_scales(row_scales), packed(packed), gemv_packed(gemv_packed) {}
  TensorView data;
  const float* row_scales;
  const void* packed;
  const void* gemv_packed;
};

// An I8 [n, k] weight rearranged once into the blocked layout of oneDNN's fastest int8 kernels
// (AMX or VNNI brgemm), which they would otherwise rebuild from the plain layout on every call.
Tensor PackMatmulWeight(const TensorView& w);

// Whether Matmul reads PackMatmulWeight's layout of an I8 [n, k] weight that also has
// PackGemvWeight's (if the CPU runs Int8Gemv): not where AMX-INT8 tiles run the shape, or Int8Gemv
// every batch, which read the latter at every batch size, so that one packed copy of the weight is
// held, not two; and not where oneDNN's INT8 GEMM is not exact (no VNNI).
bool NeedsMatmulPacking(int64_t n, int64_t k);

// Whether Matmul reads an I8 [n, k] weight's plain rows (`data`): where neither Int8Gemv nor an
// exact oneDNN INT8 GEMM runs (a CPU without AVX2), through portable loops.
bool NeedsPlainI8(int64_t n, int64_t k);

// An I8 [n, k] weight laid out for the hand-written kernel Matmul runs on a few rows (decode), or,
// on a CPU without it (no AVX2), an empty tensor.
Tensor PackGemvWeight(const TensorView& w);

// y[m, n] = x[m, k] · w^T. BF16 weights take activations rounded to BF16 (on CPUs without AVX-512,
// through BatchInvariantMatmul's loops); I8 weights take activations quantized per row by
// QuantizeRows (A8W8), accumulate in INT32 and scale in FP32.
void Matmul(const float* x, int64_t m, const Weight& w, float* y);

// Matmul of I8 weights with activations QuantizeRows already made (e.g. on another rank): the
// same result as Matmul of the rows they came from.
void MatmulQuantized(const int8_t* x, const float* x_scales, int64_t m, const Weight& w, float* y);

// I8 weights give out their output columns in blocks of this many (MatmulQuantizedBlocks).
inline constexpr int64_t kMatmulColumnBlock = 64;

// Whether MatmulQuantizedBlocks runs an I8 weight at m rows: where MatmulQuantized runs the
// hand-written kernel for a few rows (decode).
bool MatmulRunsByBlocks(int64_t m, const Weight& w);

// MatmulQuantized's columns of blocks [block_begin, block_end) (kMatmulColumnBlock columns a block,
// the last one cut at n), on the calling thread alone, with the same bits: for callers that share
// a weight's blocks out among threads together with other work. Needs MatmulRunsByBlocks(m, w).
void MatmulQuantizedBlocks(const int8_t* x, const float* x_scales, int64_t m, const Weight& w, int64_t block_begin,
                           int64_t block_end, float* y);

// Matmul of I8 weights whose activation rows go in as two INT8 parts: the row quantized, then what
// that left, quantized again (about 14 significant bits instead of 7), each part's products summed
// exactly in INT32 and the two added. For the lm_head, whose logits INT8 activations alone blur;
// rows are independent of each other to the bit, as in every INT8 GEMM.
//
// A row flagged in `argmax_only` is only ever used for its first maximum (greedy decoding), and
// its second part's products are found only for the columns that could be that maximum, from the
// plain weight's rows (w.data; without it flags are ignored): the GEMM runs one row for it instead
// of two. Its first maximal column and that column's value are the same bits as unflagged; no
// other column exceeds that maximum (those that could reach it hold their exact values).
// Cauchy-Schwarz bounds a column's second part by |second part of x| * row_norms[j] (I8RowNorms).
// With `first_max`, a flagged row's first maximal column goes to first_max[row] (found among the
// few columns that could hold it), -1 for the others.
void MatmulTwoPart(const float* x, int64_t m, const Weight& w, float* y, const std::vector<bool>& argmax_only = {},
                   const float* row_norms = nullptr, int32_t* first_max = nullptr);

// An upper bound on the L2 norm of each row of an I8 weight, dequantized (q * scale): [n] floats.
Tensor I8RowNorms(const TensorView& w, const float* row_scales);

// Matmul whose rows are independent of each other to the bit: each y[r, j] sums its k products in
// one fixed order, whatever m, the row's place in the batch or the thread count (oneDNN orders
// its F32 and BF16 sums differently for different m). For the GEMMs outside W8A8's exact INT8
// path -- the router, and the lm_head of F32 and BF16 runs -- so that a request's logits do not
// depend on its batch. F32 or BF16 weights (activations rounded to BF16, as Matmul does); I8
// weights go to Matmul, already exact. Its oracle is ref::Matmul.
void BatchInvariantMatmul(const float* x, int64_t m, const Weight& w, float* y);

// Symmetric per-row INT8 quantization: scales[r] = max|x[r]| / 127 and q = round(x / scales[r]),
// halves to even. An all-zero row gets scale 0 and zeros.
void QuantizeRows(const float* x, int64_t rows, int64_t cols, int8_t* q, float* scales);

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for each of `rows` rows of `dim` values.
// x and y may alias.
void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y);

// y[i] = silu(gate[i]) * up[i]. y may alias gate or up.
void SiluMul(const float* gate, const float* up, int64_t n, float* y);

// Rotary embedding on interleaved pairs (x[2i], x[2i+1]) by angle position * inv_freq[i], the
// result scaled by `scale` (YaRN's cos/sin factor).
struct RopeParams {
  const double* inv_freq = nullptr;  // dim / 2 entries
  int64_t dim = 0;
  double scale = 1.0;
};
// Rotates `heads` vectors of each of `tokens` rows in place: vector h of token t starts at
// x + t * token_stride + h * head_stride.
void ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t token_stride, int64_t head_stride,
               const int32_t* positions, const RopeParams& rope);

// Causal multi-head attention, expanded form. Query t sits at position q_offset + t and sees keys
// 0..q_offset + t. q: [tokens, heads, qk_dim], k: [keys, heads, qk_dim], v: [keys, heads, v_dim],
// out: [tokens, heads, v_dim]. A token's output is the same bits whatever other tokens the call
// holds and whatever the thread count: it depends only on its query, its position and the keys.
struct AttentionParams {
  int64_t tokens = 0;
  int64_t keys = 0;
  int64_t heads = 0;
  int64_t qk_dim = 0;
  int64_t v_dim = 0;
  int64_t q_offset = 0;
  float scale = 1.0f;
  // Products of BF16-rounded queries, keys, probabilities and values, summed in F32 (as flash
  // attention runs on GPUs), where the CPU has AVX512-BF16: for keys and values expanded from a
  // BF16 cache, already that precise. Otherwise F32 products.
  bool bf16_products = false;
};
void Attention(const float* q, const float* k, const float* v, const AttentionParams& p, float* out);

// Causal MLA attention in the absorbed form, over the latent cache: score(t, h, s) =
// (q_lat[t,h]·c_kv[s] + q_pe[t,h]·k_pe[s]) * scale; out[t,h] = sum_s P(t,h,s) c_kv[s].
// q_lat: [tokens, heads, kv_lora], q_pe: [tokens, heads, rope], c_kv: [keys, kv_lora],
// k_pe: [keys, rope], out: [tokens, heads, kv_lora]. The cache is F32 or BF16 (C16); the
// arithmetic is F32 either way.
//
// The softmax is computed online over blocks of keys; when a block raises the running maximum,
// the output accumulated so far is rescaled, by AMLA's exponent add (default) or by the plain
// multiply it replaces. Both give the same result up to float rounding (see
// cpu/latent_attention.cc); the plain one is the baseline tests and benchmarks compare with.
// A token's output is the same bits whatever other tokens the call holds and whatever the thread
// count: it depends only on its query, its position and the cache rows it sees.
enum class SoftmaxRescale { kAmla, kMultiply };

// A paged cache is read through its block table: key r is row block_table[r / block_size] *
// block_size + r % block_size of c_kv and k_pe (without a table, row r).
struct LatentAttentionParams {
  int64_t tokens = 0;
  int64_t keys = 0;
  int64_t heads = 0;
  int64_t kv_lora = 0;
  int64_t rope = 0;
  int64_t q_offset = 0;
  float scale = 1.0f;
  SoftmaxRescale rescale = SoftmaxRescale::kAmla;
  const int32_t* block_table = nullptr;
  int64_t block_size = 0;

  int64_t CacheRow(int64_t key) const {
    return block_table ? block_table[key / block_size] * block_size + key % block_size : key;
  }
};
void LatentAttention(const float* q_lat, const float* q_pe, const float* c_kv, const float* k_pe,
                     const LatentAttentionParams& p, float* out);
void LatentAttention(const float* q_lat, const float* q_pe, const bf16* c_kv, const bf16* k_pe,
                     const LatentAttentionParams& p, float* out);
// Whether LatentAttention splits p's heads over the threads: a lone token over a context short
// enough for one range of keys (longer ones split the keys). Its heads then give the same bits
// whichever heads share a call, so a caller may split them itself, calling LatentAttention on
// ranges of heads (q_lat, q_pe and out moved to the range's first head, p.heads its count) from a
// parallel loop of its own.
bool LatentAttentionSplitsHeads(const LatentAttentionParams& p);

}  // namespace moe::kernels
