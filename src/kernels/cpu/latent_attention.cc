// LatentAttention on the CPU: MLA attention in the absorbed form over the latent cache, for decode
// tokens and prompt tokens alike (one form for both keeps a token's result independent of how it
// was scheduled), with the AMLA online-softmax rescale.
//
// Layout of the work. In the absorbed form every head of a token reads the same cached rows (MLA is
// multi-query attention over [c_kv, k_pe]), and neighbouring tokens of a prompt read nearly the
// same rows, so the kernel walks the cache once for a few tokens at a time, in tiles of kKeyBlock
// keys: a tile is brought into the form the ISA's loops want once (widened to F32, or laid out for
// AMX tiles), then every row -- one head of one token -- takes its scores against the tile and
// adds its probability-weighted rows to its output (KeyTileKernel). A token's keys are cut into
// contiguous ranges, each with its own softmax state, folded in order into the result as they end;
// how many and where depends only on how many keys the token sees, and tiles start at multiples of
// kKeyBlock whoever asks, so a token's result is the same bits whether it comes alone (decode), in a
// prompt chunk of any size or with any thread count. Parallel work is split over groups of tokens,
// or, when there are fewer tokens than threads (decode), over (token, range) pairs; the arithmetic
// is the same either way. Splitting over heads instead would make every thread stream the whole
// cache from memory, so only a lone token over a context too short for ranges (one range) splits
// its heads.
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
// Folding a finished key range into the result rescales the one of smaller reference the same way.
#include "kernels/cpu/latent_attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numbers>
#include <type_traits>
#include <vector>

#include "base/int_math.h"
#include "base/thread_pool.h"

namespace moe::kernels::cpu {
namespace {

constexpr int64_t kGroupTokens = 4;     // tokens whose rows share each tile: 64 rows at 16 heads
constexpr int64_t kMinRangeKeys = 256;  // a key range shorter than this is not worth its merge
constexpr int64_t kMaxKeyRanges = 16;   // enough ranges for 16 threads on one decode token
constexpr int32_t kMinShift = -255;     // 2^-255 flushes every finite float to zero

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

// --- The F32 tile kernel --------------------------------------------------------------------------

// Asks for cache rows [first, first + count) of `width` values, one block of rows at a time.
template <typename T>
void PrefetchRowsToL2(const LatentAttentionParams& p, const T* data, int64_t width, int64_t first, int64_t count) {
  const int64_t run = p.block_table ? p.block_size : std::numeric_limits<int64_t>::max();  // rows in a row
  for (int64_t key = first; key < first + count;) {
    const int64_t rows = std::min(first + count - key, run - key % run);
    const char* bytes = reinterpret_cast<const char*>(data + p.CacheRow(key) * width);
    for (int64_t b = 0; b < rows * width * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(bytes + b, 0, 2);
    key += rows;
  }
}

// The tile widened to F32 rows, the ISA's LatentOps doing the arithmetic.
class F32KeyTileKernel final : public KeyTileKernel {
 public:
  F32KeyTileKernel(const LatentOps& ops, const LatentAttentionParams& p)
      : ops_(ops), p_(p), layout_(p), tile_(kKeyBlock * layout_.dim, 0.0f) {}

  void SetQueries(const float* q, int64_t rows) override {
    q_ = q;
    rows_ = rows;
  }
  void LoadKeys(const float* c_kv, const float* k_pe, const LatentAttentionParams& p, int64_t first,
                int64_t count) override {
    Load(c_kv, k_pe, p, first, count);
  }
  void LoadKeys(const bf16* c_kv, const bf16* k_pe, const LatentAttentionParams& p, int64_t first,
                int64_t count) override {
    Load(c_kv, k_pe, p, first, count);
  }
  void Scores(int64_t row_begin, float* scores) override {
    ops_.scores(q_ + row_begin * layout_.dim, rows_ - row_begin, tile_.data(), count_, layout_.dim,
                scores + row_begin * kKeyBlock, kKeyBlock);
  }
  void Accumulate(const float* p, const int64_t* counts, int64_t row_begin, float* o) override {
    // Rows of one count at a time: a row's sum runs over its own keys and no further.
    for (int64_t r = row_begin, end; r < rows_; r = end) {
      for (end = r + 1; end < rows_ && counts[end] == counts[r];) ++end;
      ops_.accumulate(p + r * kKeyBlock, kKeyBlock, end - r, tile_.data(), counts[r], layout_.dim, layout_.lora,
                      o + r * layout_.lora, layout_.lora);
    }
  }

 private:
  template <typename T>
  void Load(const T* c_kv, const T* k_pe, const LatentAttentionParams& p, int64_t first, int64_t count) {
    for (int64_t j = 0; j < count; ++j) {
      float* row = tile_.data() + j * layout_.dim;
      const int64_t cache_row = p.CacheRow(first + j);
      const T* c = c_kv + cache_row * p_.kv_lora;
      const T* r = k_pe + cache_row * p_.rope;
      if constexpr (std::is_same_v<T, bf16>) {
        ops_.widen(c, p_.kv_lora, row);
        ops_.widen(r, p_.rope, row + layout_.lora);
      } else {
        std::copy(c, c + p_.kv_lora, row);
        std::copy(r, r + p_.rope, row + layout_.lora);
      }
    }
    // Ask for the next tile's rows now, so that memory delivers them while this tile computes
    // instead of stalling the next fill (about 6% faster at 16K keys, measured). Not past the end
    // of the last key's block: the block table has no entry beyond it.
    const int64_t next = std::min(kKeyBlock, RoundUp(p.keys, std::max<int64_t>(p.block_size, 1)) - first - count);
    PrefetchRowsToL2(p, c_kv, p_.kv_lora, first + count, next);
    PrefetchRowsToL2(p, k_pe, p_.rope, first + count, next);
    count_ = count;
  }

  const LatentOps& ops_;
  const LatentAttentionParams p_;
  const RowLayout layout_;
  std::vector<float> tile_;  // [kKeyBlock, layout_.dim], zeroed once so the padding stays zero
  const float* q_ = nullptr;
  int64_t rows_ = 0, count_ = 0;
};

// --- The driver ------------------------------------------------------------------------------------

const LatentOps& OpsFor(Isa isa) {
  MOE_CHECK(IsaSupported(isa), "LatentAttention: this CPU cannot run the requested ISA");
  switch (isa) {
    case Isa::kGeneric: return GenericLatentOps();
    case Isa::kAvx2: return Avx2LatentOps();
    case Isa::kAvx512:
    case Isa::kAmx: break;
  }
  return Avx512LatentOps();
}

struct HeadState {
  float m = -INFINITY;  // the reference: integer-valued with AMLA; -Inf before any key
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

// (acc_o, acc) := the union of itself and the key range (o, s): both onto the larger reference,
// then summed. An empty accumulator takes the range as it is, so that folding ranges one by one
// from empty gives the same bits whether they were computed in one task or in several. Rescales o.
void Fold(const LatentOps& ops, SoftmaxRescale how, int64_t width, float* o, HeadState s, float* acc_o,
          HeadState& acc) {
  if (acc.m == -INFINITY) {
    std::copy(o, o + width, acc_o);
    acc = s;
    return;
  }
  const float m = std::max(acc.m, s.m);
  if (acc.m < m) Rescale(ops, how, acc.m, m, acc_o, width, acc.l);
  if (s.m < m) Rescale(ops, how, s.m, m, o, width, s.l);
  for (int64_t i = 0; i < width; ++i) acc_o[i] += o[i];
  acc.l += s.l;
  acc.m = m;
}

// Where a token that sees `visible` keys cuts them: ranges of `size` keys (a multiple of
// kKeyBlock), `count` of them, none empty. A function of `visible` alone.
struct KeyRanges {
  explicit KeyRanges(int64_t visible) {
    const int64_t wanted = std::clamp<int64_t>(visible / kMinRangeKeys, 1, kMaxKeyRanges);
    size = RoundUp(CeilDiv(visible, wanted), kKeyBlock);
    count = CeilDiv(visible, size);
  }
  int64_t size;
  int64_t count;
};

// A task's buffers for up to `tokens` tokens: their queries, a tile's scores, the open range's
// output and state per row, and the result so far per row.
struct Scratch {
  Scratch(Isa isa, bool bf16_cache, const LatentAttentionParams& p, const RowLayout& layout, int64_t tokens)
      : kernel(MakeKeyTileKernel(isa, bf16_cache, p, tokens * p.heads)),
        rows(RoundUp(tokens * p.heads, KeyTileKernel::kRowAlign)),
        q(rows * layout.dim, 0.0f),
        scores(rows * kKeyBlock),
        o(rows * layout.lora),
        acc(rows * layout.lora),
        state(rows),
        acc_state(rows),
        counts(rows) {}
  std::unique_ptr<KeyTileKernel> kernel;
  int64_t rows;
  std::vector<float> q;  // the padding stays zero
  std::vector<float> scores, o, acc;
  std::vector<HeadState> state, acc_state;
  std::vector<int64_t> counts;
};

// This thread's Scratch for `tokens` tokens of p's shape, kept from call to call: decode attends
// once per sequence and layer, and a new one, ~300 KB zeroed, cost more than attending over a
// short context. The tile kernels use only the shape fields of p (heads, kv_lora, rope).
Scratch& ScratchFor(Isa isa, bool bf16_cache, const LatentAttentionParams& p, const RowLayout& layout,
                    int64_t tokens) {
  struct Cached {
    Isa isa;
    bool bf16_cache;
    int64_t heads, kv_lora, rope, tokens;
    std::unique_ptr<Scratch> scratch;
  };
  thread_local Cached cached{};
  if (!cached.scratch || cached.isa != isa || cached.bf16_cache != bf16_cache || cached.heads != p.heads ||
      cached.kv_lora != p.kv_lora || cached.rope != p.rope || cached.tokens != tokens) {
    cached = {isa, bf16_cache, p.heads, p.kv_lora, p.rope, tokens,
              std::make_unique<Scratch>(isa, bf16_cache, p, layout, tokens)};
  }
  return *cached.scratch;
}

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

// Tokens [t0, t1), each over the keys it sees in [lo, hi) (lo a multiple of kKeyBlock): their
// ranges folded, in order, into s.acc and s.acc_state (row (t - t0) * heads + h).
template <typename T>
void AttendTokens(const LatentOps& ops, const LatentAttentionParams& p, const RowLayout& layout, const float* q_lat,
                  const float* q_pe, const T* c_kv, const T* k_pe, int64_t t0, int64_t t1, int64_t lo, int64_t hi,
                  Scratch& s) {
  const int64_t rows = (t1 - t0) * p.heads;
  for (int64_t t = t0; t < t1; ++t) {
    PrepareQuery(p, layout, q_lat, q_pe, t, s.q.data() + (t - t0) * p.heads * layout.dim);
  }
  s.kernel->SetQueries(s.q.data(), rows);
  std::fill(s.o.begin(), s.o.begin() + rows * layout.lora, 0.0f);
  std::fill(s.state.begin(), s.state.begin() + rows, HeadState{});
  std::fill(s.acc_state.begin(), s.acc_state.begin() + rows, HeadState{});
  auto end_of = [&](int64_t t) { return std::min(hi, p.q_offset + t + 1); };
  auto fold_token = [&](int64_t t) {
    for (int64_t r = (t - t0) * p.heads; r < (t - t0 + 1) * p.heads; ++r) {
      Fold(ops, p.rescale, layout.lora, s.o.data() + r * layout.lora, s.state[r], s.acc.data() + r * layout.lora,
           s.acc_state[r]);
    }
  };
  int64_t active = t0;  // the tokens before it have seen all their keys
  for (int64_t first = lo; first < end_of(t1 - 1); first += kKeyBlock) {
    while (end_of(active) <= first) ++active;
    const int64_t row_begin = (active - t0) * p.heads;
    s.kernel->LoadKeys(c_kv, k_pe, p, first, std::min(kKeyBlock, end_of(t1 - 1) - first));
    s.kernel->Scores(row_begin, s.scores.data());
    for (int64_t t = active; t < t1; ++t) {
      const int64_t count = std::min(kKeyBlock, end_of(t) - first);
      const bool new_range = first > lo && first % KeyRanges(p.q_offset + t + 1).size == 0;
      if (new_range) fold_token(t);
      for (int64_t r = (t - t0) * p.heads; r < (t - t0 + 1) * p.heads; ++r) {
        float* o = s.o.data() + r * layout.lora;
        HeadState& st = s.state[r];
        if (new_range) {
          std::fill(o, o + layout.lora, 0.0f);
          st = HeadState{};
        }
        float* x = s.scores.data() + r * kKeyBlock;
        const float tile_max = ops.max(x, count);
        const float m = std::max(st.m, p.rescale == SoftmaxRescale::kAmla ? std::ceil(tile_max) : tile_max);
        if (m > st.m && st.l > 0) Rescale(ops, p.rescale, st.m, m, o, layout.lora, st.l);
        st.m = m;
        st.l += ops.exp2_sum(x, count, m);
        std::fill(x + count, x + kKeyBlock, 0.0f);
        s.counts[r] = count;
      }
    }
    s.kernel->Accumulate(s.scores.data(), s.counts.data(), row_begin, s.o.data());
    // A token whose last key was in this tile is done: fold it now, as later tiles, which add
    // nothing to it, need not leave its output bit for bit as it was.
    for (int64_t t = active; t < t1 && end_of(t) <= first + kKeyBlock; ++t) fold_token(t);
  }
}

// out [heads, kv_lora] of one token from its accumulated rows acc [heads, lora].
void Normalize(const LatentAttentionParams& p, const RowLayout& layout, const float* acc, const HeadState* state,
               float* out) {
  for (int64_t h = 0; h < p.heads; ++h) {
    const float* a = acc + h * layout.lora;
    for (int64_t i = 0; i < p.kv_lora; ++i) out[h * p.kv_lora + i] = a[i] / state[h].l;
  }
}

template <typename T>
void Run(Isa isa, int64_t splits, const float* q_lat, const float* q_pe, const T* c_kv, const T* k_pe,
         const LatentAttentionParams& p, float* out) {
  const LatentOps& ops = OpsFor(isa);
  const RowLayout layout(p);
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  // The most ranges any token has (not always the last token's: a longer range can mean fewer).
  int64_t max_ranges = 1;
  for (int64_t t = 0; t < p.tokens; ++t) max_ranges = std::max(max_ranges, KeyRanges(p.q_offset + t + 1).count);

  if (LatentAttentionSplitsHeads(p)) {
    // One token over one range (decode at a short context): its heads split over the threads, so
    // that the others do not wait for one thread's attention. A head's rows give the same bits
    // whichever heads share its tiles.
    ParallelFor(p.heads, [&](int64_t h0, int64_t h1) {
      LatentAttentionParams heads = p;
      heads.heads = h1 - h0;
      Scratch& scratch = ScratchFor(isa, kBf16, heads, layout, 1);
      AttendTokens(ops, heads, layout, q_lat + h0 * p.kv_lora, q_pe + h0 * p.rope, c_kv, k_pe, 0, 1, 0, p.keys,
                   scratch);
      Normalize(heads, layout, scratch.acc.data(), scratch.acc_state.data(), out + h0 * p.kv_lora);
    });
    return;
  }
  if (splits <= 1 || max_ranges == 1) {
    // Groups of kGroupTokens tokens, handed out from both ends (first, last, second, ...) so that
    // any contiguous share of them carries about as many keys as any other: later tokens see more.
    const int64_t groups = CeilDiv(p.tokens, kGroupTokens);
    ParallelFor(groups, [&](int64_t begin, int64_t end) {
      Scratch& scratch = ScratchFor(isa, kBf16, p, layout, kGroupTokens);
      for (int64_t i = begin; i < end; ++i) {
        const int64_t g = i % 2 == 0 ? i / 2 : groups - 1 - i / 2;
        const int64_t t0 = g * kGroupTokens, t1 = std::min(p.tokens, t0 + kGroupTokens);
        AttendTokens(ops, p, layout, q_lat, q_pe, c_kv, k_pe, t0, t1, 0, p.keys, scratch);
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t r = (t - t0) * p.heads;
          Normalize(p, layout, scratch.acc.data() + r * layout.lora, scratch.acc_state.data() + r,
                    out + t * p.heads * p.kv_lora);
        }
      }
    });
    return;
  }

  // One task per (token, range), then one per token to fold its ranges in order.
  const int64_t head_floats = p.heads * layout.lora;
  std::vector<float> partial_o(p.tokens * max_ranges * head_floats);
  std::vector<HeadState> partial_state(p.tokens * max_ranges * p.heads);
  ParallelFor(p.tokens * max_ranges, [&](int64_t task_begin, int64_t task_end) {
    Scratch& scratch = ScratchFor(isa, kBf16, p, layout, 1);
    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t t = task / max_ranges, r = task % max_ranges;
      const KeyRanges ranges(p.q_offset + t + 1);
      if (r >= ranges.count) continue;
      AttendTokens(ops, p, layout, q_lat, q_pe, c_kv, k_pe, t, t + 1, r * ranges.size, (r + 1) * ranges.size,
                   scratch);
      std::copy(scratch.acc.begin(), scratch.acc.begin() + head_floats, partial_o.begin() + task * head_floats);
      std::copy(scratch.acc_state.begin(), scratch.acc_state.begin() + p.heads,
                partial_state.begin() + task * p.heads);
    }
  });
  ParallelFor(p.tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(head_floats);
    std::vector<HeadState> acc_state(p.heads);
    for (int64_t t = begin; t < end; ++t) {
      std::fill(acc_state.begin(), acc_state.end(), HeadState{});
      for (int64_t r = 0; r < KeyRanges(p.q_offset + t + 1).count; ++r) {
        const int64_t task = t * max_ranges + r;
        for (int64_t h = 0; h < p.heads; ++h) {
          Fold(ops, p.rescale, layout.lora, partial_o.data() + task * head_floats + h * layout.lora,
               partial_state[task * p.heads + h], acc.data() + h * layout.lora, acc_state[h]);
        }
      }
      Normalize(p, layout, acc.data(), acc_state.data(), out + t * p.heads * p.kv_lora);
    }
  });
}

}  // namespace

const LatentOps& GenericLatentOps() {
  static const LatentOps ops{WidenGeneric,     ScoresGeneric, MaxGeneric,  Exp2SumGeneric,
                             AccumulateGeneric, ScalePow2Generic, ScaleGeneric};
  return ops;
}

RowLayout::RowLayout(const LatentAttentionParams& p)
    : lora(RoundUp(p.kv_lora, kLatentLanes)), dim(lora + RoundUp(p.rope, kLatentLanes)) {}

Isa BestLatentIsa() {
  static const Isa isa = IsaSupported(Isa::kAmx)      ? Isa::kAmx
                         : IsaSupported(Isa::kAvx512) ? Isa::kAvx512
                         : IsaSupported(Isa::kAvx2)   ? Isa::kAvx2
                                                      : Isa::kGeneric;
  return isa;
}

std::unique_ptr<KeyTileKernel> MakeKeyTileKernel(Isa isa, bool bf16_cache, const LatentAttentionParams& p,
                                                 int64_t max_rows) {
  if (isa == Isa::kAmx && bf16_cache) return MakeAmxKeyTileKernel(p, max_rows);
  return std::make_unique<F32KeyTileKernel>(OpsFor(isa), p);
}

int64_t KeySplits(const LatentAttentionParams& p, int64_t threads) {
  // More than 1 when some token may have several ranges: KeyRanges(n).count never exceeds
  // clamp(n / kMinRangeKeys, 1, kMaxKeyRanges), which grows with n.
  return p.tokens < threads ? std::clamp<int64_t>((p.q_offset + p.tokens) / kMinRangeKeys, 1, kMaxKeyRanges) : 1;
}

void LatentAttention(Isa isa, int64_t key_splits, const float* q_lat, const float* q_pe, const float* c_kv,
                     const float* k_pe, const LatentAttentionParams& p, float* out) {
  Run(isa, key_splits, q_lat, q_pe, c_kv, k_pe, p, out);
}

void LatentAttention(Isa isa, int64_t key_splits, const float* q_lat, const float* q_pe, const bf16* c_kv,
                     const bf16* k_pe, const LatentAttentionParams& p, float* out) {
  Run(isa, key_splits, q_lat, q_pe, c_kv, k_pe, p, out);
}

}  // namespace moe::kernels::cpu

namespace moe::kernels {

bool LatentAttentionSplitsHeads(const LatentAttentionParams& p) {
  return p.tokens == 1 && cpu::KeyRanges(p.q_offset + 1).count == 1;
}

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
