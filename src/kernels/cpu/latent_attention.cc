// LatentAttention on the CPU: MLA attention in the absorbed form over the latent cache, written for
// decode (one query token per sequence over a long cache), with the AMLA online-softmax rescale.
//
// Layout of the work. In the absorbed form every head of a token reads the same cached rows (MLA is
// multi-query attention over [c_kv, k_pe]), so the kernel walks the cache once per token, in tiles
// of kBlock keys: a tile is widened to F32 once for all heads (this is where a BF16 cache is
// converted), then every head takes its scores against the tile and adds its probability-weighted
// rows to its output. A token's keys are cut into contiguous ranges, each with its own softmax
// state, merged at the end; how many and where depends only on how many keys the token sees, so a
// token's result is the same bits whether it comes alone (decode), in a prompt chunk of any size
// or with any thread count. Parallel work is split over tokens, a token's ranges then running one
// after the other in its task, or, when there are fewer tokens than threads (decode), over
// (token, range) pairs; the arithmetic is the same either way. Splitting over heads instead would
// make every thread stream the whole cache from memory.
//
// Online softmax in base 2. A score s is taken as x = s * log2(e) (folded into the query), so that
// softmax_j = 2^(x_j - m) / sum_i 2^(x_i - m) for any reference m. Each head keeps m, the sum
// l = sum_j 2^(x_j - m) and the output O = sum_j 2^(x_j - m) v_j over the keys seen so far. When a
// tile holds keys above m, the reference moves up to m' and l and O are multiplied by 2^(m - m');
// O / l does not depend on m, which only has to keep 2^(x - m) <= 1 so that nothing overflows.
//
// AMLA ("MUL by ADD in FlashAttention Rescaling"): keep m an integer, m' = max(m, ceil(max_j x_j)).
// The rescale factor 2^(m - m') = 2^d is then a power of two with d an integer <= 0, and a normal
// float times 2^d is the same float with d added to its exponent field: bits + (d << 23), an
// integer add instead of a multiply, and exact. The residual factor -- the part of the true
// maximum the rounding skipped, 2^(max x - m') in (1/2, 1] -- is not applied anywhere: it stays
// folded into the probabilities P_j = 2^(x_j - m'), computed against the rounded reference (the
// largest P so far lies in (1/2, 1] instead of being exactly 1), and cancels in O / l. So the
// result equals the plain rescale's up to float rounding. On a CPU the add costs what the multiply
// does (one vector op per 16 floats, once per head per tile that raises the max), and the
// benchmarks see no difference in speed (bench/RESULTS.md); what AMLA does bring here is a rescale
// that adds no rounding of its own, and rarer rescales, since m moves in whole steps.
//
// Limits of the exponent add (d < 0; the exponent never grows, so there is no overflow case):
// - Zeros: the exponent field of 0 is 0, and adding d << 23 would wrap through the sign bit into
//   -Inf or a huge negative number. So every element whose exponent field e would fall to
//   e + d <= 0 -- zeros, denormals, and normals whose product leaves the normal range -- is
//   flushed to zero. What is lost is below 2^-126 in magnitude, against an output whose largest
//   term is P |v| with P > 1/2: negligible unless the cached values themselves are near the float
//   minimum (they are RMSNorm outputs). The plain multiply would have kept such products as
//   denormals.
// - Large shifts (a tile whose scores jump far above the running max): d is clamped at -255, where
//   every finite float flushes to zero anyway, which also keeps d << 23 inside an int32.
// - Inf and NaN (e = 255) are left as they are, so a non-finite input still shows in the output,
//   as it would with the multiply.
// The merge of key ranges rescales each range's O by 2^(m_range - m_max) in the same way.
#include "kernels/cpu/latent_attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>
#include <type_traits>
#include <vector>

#include "base/cpu_features.h"
#include "base/thread_pool.h"

namespace moe::kernels::cpu {
namespace {

constexpr int64_t kBlock = 64;          // keys per tile: 64 x 576 F32 = 144 KiB, resident in L2
constexpr int64_t kMinRangeKeys = 256;  // a key range shorter than this is not worth its merge
constexpr int64_t kMaxKeyRanges = 16;   // enough ranges for 16 threads on one decode token
constexpr int32_t kMinShift = -255;     // 2^-255 flushes every finite float to zero

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// --- Generic ops -------------------------------------------------------------------------------

void WidenGeneric(const bf16* src, int64_t count, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = Bf16ToF32(src[i]);
}

void ScoresGeneric(const float* q, int64_t heads, const float* keys, int64_t count, int64_t dim,
                   float* scores, int64_t score_stride) {
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < count; ++j) {
      float acc = 0;
      for (int64_t i = 0; i < dim; ++i) acc += q[h * dim + i] * keys[j * dim + i];
      scores[h * score_stride + j] = acc;
    }
  }
}

float MaxGeneric(const float* x, int64_t count) {
  float m = x[0];
  for (int64_t j = 1; j < count; ++j) m = std::max(m, x[j]);
  return m;
}

float Exp2SumGeneric(float* x, int64_t count, float ref) {
  float sum = 0;
  for (int64_t j = 0; j < count; ++j) sum += (x[j] = std::exp2(x[j] - ref));
  return sum;
}

void AccumulateGeneric(const float* p, int64_t p_stride, int64_t heads, const float* keys, int64_t count,
                       int64_t dim, int64_t width, float* out, int64_t out_stride) {
  for (int64_t h = 0; h < heads; ++h) {
    float* o = out + h * out_stride;
    for (int64_t j = 0; j < count; ++j) {
      const float pj = p[h * p_stride + j];
      const float* row = keys + j * dim;
      for (int64_t i = 0; i < width; ++i) o[i] += pj * row[i];
    }
  }
}

void ScalePow2Generic(float* x, int64_t count, int32_t shift) {
  const uint32_t add = static_cast<uint32_t>(shift) << 23;  // modular: adds a negative shift
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(x[i]);
    const int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xff);
    if (exponent == 0xff) continue;
    x[i] = exponent + shift > 0 ? std::bit_cast<float>(bits + add) : 0.0f;
  }
}

void ScaleGeneric(float* x, int64_t count, float factor) {
  for (int64_t i = 0; i < count; ++i) x[i] *= factor;
}

// --- The kernel ----------------------------------------------------------------------------------

template <typename T>
void PrefetchToL2(const T* data, int64_t count) {
  const char* bytes = reinterpret_cast<const char*>(data);
  for (int64_t b = 0; b < count * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(bytes + b, 0, 2);
}

// Where the parts of a padded row sit: [c_kv, 0... | k_pe, 0...].
struct RowLayout {
  explicit RowLayout(const LatentAttentionParams& p)
      : lora(RoundUp(p.kv_lora, kLatentLanes)), dim(lora + RoundUp(p.rope, kLatentLanes)) {}
  int64_t lora;  // the padded width of c_kv, and of the outputs
  int64_t dim;   // the padded width of a row
};

struct HeadState {
  float m = -INFINITY;  // the reference: integer-valued with AMLA
  float l = 0;          // sum of 2^(x - m)
};

// Multiplies o[0..count) and l by 2^(from - to), from <= to.
void Rescale(const LatentOps& ops, SoftmaxRescale how, float from, float to, float* o, int64_t count, float& l) {
  if (how == SoftmaxRescale::kAmla) {
    const int32_t shift = static_cast<int32_t>(std::max(from - to, static_cast<float>(kMinShift)));
    ops.scale_pow2(o, count, shift);
    l = std::ldexp(l, shift);
  } else {
    const float factor = std::exp2(from - to);
    ops.scale(o, count, factor);
    l *= factor;
  }
}

// One token's heads over cache rows [begin, end). q: [heads, dim], the padded query already
// scaled by scale * log2(e); o: [heads, lora], zeroed; state: [heads], fresh.
// tile: [kBlock, layout.dim] F32 whose padding columns are zero; scores: [heads, kBlock].
template <typename T>
void AttendRange(const LatentOps& ops, const LatentAttentionParams& p, const RowLayout& layout, const float* q,
                 const T* c_kv, const T* k_pe, int64_t begin, int64_t end, float* o, HeadState* state,
                 Tensor& tile, std::vector<float>& scores) {
  for (int64_t first = begin; first < end; first += kBlock) {
    const int64_t count = std::min(kBlock, end - first);
    for (int64_t j = 0; j < count; ++j) {
      float* row = tile.data<float>() + j * layout.dim;
      const T* c = c_kv + (first + j) * p.kv_lora;
      const T* r = k_pe + (first + j) * p.rope;
      if constexpr (std::is_same_v<T, bf16>) {
        ops.widen(c, p.kv_lora, row);
        ops.widen(r, p.rope, row + layout.lora);
      } else {
        std::copy(c, c + p.kv_lora, row);
        std::copy(r, r + p.rope, row + layout.lora);
      }
    }
    // Ask for the next tile's rows now, so that memory delivers them while this tile computes
    // instead of stalling the next fill (about 6% faster at 16K keys, measured).
    const int64_t next = std::min(kBlock, end - first - count);
    PrefetchToL2(c_kv + (first + count) * p.kv_lora, next * p.kv_lora);
    PrefetchToL2(k_pe + (first + count) * p.rope, next * p.rope);
    ops.scores(q, p.heads, tile.data<float>(), count, layout.dim, scores.data(), kBlock);
    for (int64_t h = 0; h < p.heads; ++h) {
      float* x = scores.data() + h * kBlock;
      const float tile_max = ops.max(x, count);
      HeadState& s = state[h];
      const float m = std::max(s.m, p.rescale == SoftmaxRescale::kAmla ? std::ceil(tile_max) : tile_max);
      if (m > s.m && s.l > 0) Rescale(ops, p.rescale, s.m, m, o + h * layout.lora, layout.lora, s.l);
      s.m = m;
      s.l += ops.exp2_sum(x, count, m);
    }
    ops.accumulate(scores.data(), kBlock, p.heads, tile.data<float>(), count, layout.dim, layout.lora, o,
                   layout.lora);
  }
}

// Where a token that sees `visible` keys cuts them: ranges of `size` keys (a multiple of kBlock),
// `count` of them, none empty. A function of `visible` alone.
struct KeyRanges {
  explicit KeyRanges(int64_t visible) {
    const int64_t wanted = std::clamp<int64_t>(visible / kMinRangeKeys, 1, kMaxKeyRanges);
    size = RoundUp(CeilDiv(visible, wanted), kBlock);
    count = CeilDiv(visible, size);
  }
  int64_t size;
  int64_t count;
};

// A thread's buffers: the query of the token at hand, a tile of keys in F32, the tile's scores.
struct Scratch {
  Scratch(const LatentAttentionParams& p, const RowLayout& layout)
      : q(Tensor::F32({p.heads, layout.dim})), tile(Tensor::F32({kBlock, layout.dim})), scores(p.heads * kBlock) {}
  Tensor q;     // the padded query, scaled by scale * log2(e)
  Tensor tile;  // zeroed once, so the padding stays zero
  std::vector<float> scores;
};

void PrepareQuery(const LatentAttentionParams& p, const RowLayout& layout, const float* q_lat, const float* q_pe,
                  int64_t t, float* q) {
  const float q_scale = p.scale * std::numbers::log2e_v<float>;
  for (int64_t h = 0; h < p.heads; ++h) {
    const float* ql = q_lat + (t * p.heads + h) * p.kv_lora;
    const float* qp = q_pe + (t * p.heads + h) * p.rope;
    float* row = q + h * layout.dim;
    for (int64_t i = 0; i < p.kv_lora; ++i) row[i] = ql[i] * q_scale;
    for (int64_t i = 0; i < p.rope; ++i) row[layout.lora + i] = qp[i] * q_scale;
  }
}

// Range `range` of token t: its output o [heads, lora] and state [heads], from scratch.
template <typename T>
void AttendTokenRange(const LatentOps& ops, const LatentAttentionParams& p, const RowLayout& layout, const T* c_kv,
                      const T* k_pe, int64_t t, int64_t range, Scratch& scratch, float* o, HeadState* state) {
  const int64_t visible = p.q_offset + t + 1;
  const KeyRanges ranges(visible);
  const int64_t begin = range * ranges.size, end = std::min(visible, begin + ranges.size);
  std::fill(o, o + p.heads * layout.lora, 0.0f);
  std::fill(state, state + p.heads, HeadState{});
  AttendRange(ops, p, layout, scratch.q.data<float>(), c_kv, k_pe, begin, end, o, state, scratch.tile,
              scratch.scores);
}

// Merges the `count` ranges of token t, head h -- outputs o[r * o_stride], states state[r *
// state_stride] -- onto the largest reference, always in range order, and writes the result to
// out [kv_lora]. Rescales the outputs in place.
void MergeRanges(const LatentOps& ops, const LatentAttentionParams& p, const RowLayout& layout, int64_t count,
                 float* o, int64_t o_stride, HeadState* state, int64_t state_stride, float* acc, float* out) {
  float m = -INFINITY;
  for (int64_t r = 0; r < count; ++r) m = std::max(m, state[r * state_stride].m);
  std::fill(acc, acc + layout.lora, 0.0f);
  float l = 0;
  for (int64_t r = 0; r < count; ++r) {
    HeadState s = state[r * state_stride];
    float* o_r = o + r * o_stride;
    if (s.m < m) Rescale(ops, p.rescale, s.m, m, o_r, layout.lora, s.l);
    for (int64_t i = 0; i < layout.lora; ++i) acc[i] += o_r[i];
    l += s.l;
  }
  for (int64_t i = 0; i < p.kv_lora; ++i) out[i] = acc[i] / l;
}

template <typename T>
void Run(const LatentOps& ops, int64_t splits, const float* q_lat, const float* q_pe, const T* c_kv, const T* k_pe,
         const LatentAttentionParams& p, float* out) {
  const RowLayout layout(p);
  const int64_t head_floats = p.heads * layout.lora;
  // The most ranges any token has (not always the last token's: a longer range can mean fewer).
  int64_t max_ranges = 1;
  for (int64_t t = 0; t < p.tokens; ++t) max_ranges = std::max(max_ranges, KeyRanges(p.q_offset + t + 1).count);

  if (splits <= 1 || max_ranges == 1) {
    // One task per token, its ranges one after the other.
    ParallelFor(p.tokens, [&](int64_t begin, int64_t end) {
      Scratch scratch(p, layout);
      std::vector<float> o(max_ranges * head_floats), acc(layout.lora);
      std::vector<HeadState> state(max_ranges * p.heads);
      for (int64_t t = begin; t < end; ++t) {
        PrepareQuery(p, layout, q_lat, q_pe, t, scratch.q.data<float>());
        const int64_t count = KeyRanges(p.q_offset + t + 1).count;
        for (int64_t r = 0; r < count; ++r) {
          AttendTokenRange(ops, p, layout, c_kv, k_pe, t, r, scratch, o.data() + r * head_floats,
                           state.data() + r * p.heads);
        }
        for (int64_t h = 0; h < p.heads; ++h) {
          MergeRanges(ops, p, layout, count, o.data() + h * layout.lora, head_floats, state.data() + h, p.heads,
                      acc.data(), out + (t * p.heads + h) * p.kv_lora);
        }
      }
    });
    return;
  }

  // One task per (token, range), then one per (token, head) to merge.
  std::vector<float> partial_o(p.tokens * max_ranges * head_floats);
  std::vector<HeadState> partial_state(p.tokens * max_ranges * p.heads);
  ParallelFor(p.tokens * max_ranges, [&](int64_t task_begin, int64_t task_end) {
    Scratch scratch(p, layout);
    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t t = task / max_ranges, r = task % max_ranges;
      if (r >= KeyRanges(p.q_offset + t + 1).count) continue;
      PrepareQuery(p, layout, q_lat, q_pe, t, scratch.q.data<float>());
      AttendTokenRange(ops, p, layout, c_kv, k_pe, t, r, scratch, partial_o.data() + task * head_floats,
                       partial_state.data() + task * p.heads);
    }
  });
  ParallelFor(p.tokens * p.heads, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(layout.lora);
    for (int64_t th = begin; th < end; ++th) {
      const int64_t t = th / p.heads, h = th % p.heads;
      const int64_t first = t * max_ranges;
      MergeRanges(ops, p, layout, KeyRanges(p.q_offset + t + 1).count,
                  partial_o.data() + first * head_floats + h * layout.lora, head_floats,
                  partial_state.data() + first * p.heads + h, p.heads, acc.data(), out + th * p.kv_lora);
    }
  });
}

const LatentOps& OpsFor(Isa isa) {
  MOE_CHECK(IsaSupported(isa), "LatentAttention: this CPU cannot run the requested ISA");
  return isa == Isa::kAvx512 ? Avx512LatentOps() : GenericLatentOps();
}

}  // namespace

const LatentOps& GenericLatentOps() {
  static const LatentOps ops{WidenGeneric,     ScoresGeneric, MaxGeneric,  Exp2SumGeneric,
                             AccumulateGeneric, ScalePow2Generic, ScaleGeneric};
  return ops;
}

bool IsaSupported(Isa isa) { return isa == Isa::kGeneric || GetCpuFeatures().avx512f; }

Isa BestLatentIsa() {
  static const Isa isa = IsaSupported(Isa::kAvx512) ? Isa::kAvx512 : Isa::kGeneric;
  return isa;
}

int64_t KeySplits(const LatentAttentionParams& p, int64_t threads) {
  // More than 1 when some token may have several ranges: KeyRanges(n).count never exceeds
  // clamp(n / kMinRangeKeys, 1, kMaxKeyRanges), which grows with n.
  return p.tokens < threads ? std::clamp<int64_t>((p.q_offset + p.tokens) / kMinRangeKeys, 1, kMaxKeyRanges) : 1;
}

void LatentAttention(Isa isa, int64_t key_splits, const float* q_lat, const float* q_pe, const float* c_kv,
                     const float* k_pe, const LatentAttentionParams& p, float* out) {
  Run(OpsFor(isa), key_splits, q_lat, q_pe, c_kv, k_pe, p, out);
}

void LatentAttention(Isa isa, int64_t key_splits, const float* q_lat, const float* q_pe, const bf16* c_kv,
                     const bf16* k_pe, const LatentAttentionParams& p, float* out) {
  Run(OpsFor(isa), key_splits, q_lat, q_pe, c_kv, k_pe, p, out);
}

}  // namespace moe::kernels::cpu

namespace moe::kernels {

void LatentAttention(const float* q_lat, const float* q_pe, const float* c_kv, const float* k_pe,
                     const LatentAttentionParams& p, float* out) {
  cpu::LatentAttention(cpu::BestLatentIsa(), cpu::KeySplits(p, DefaultThreadPool().num_threads()), q_lat, q_pe,
                       c_kv, k_pe, p, out);
}

void LatentAttention(const float* q_lat, const float* q_pe, const bf16* c_kv, const bf16* k_pe,
                     const LatentAttentionParams& p, float* out) {
  cpu::LatentAttention(cpu::BestLatentIsa(), cpu::KeySplits(p, DefaultThreadPool().num_threads()), q_lat, q_pe,
                       c_kv, k_pe, p, out);
}

}  // namespace moe::kernels
