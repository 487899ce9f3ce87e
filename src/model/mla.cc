#include "model/mla.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "base/thread_pool.h"
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

// Rows [0, rows) of a cache tensor in F32: the tensor's own data when it is F32, else a widened
// copy kept in `widened`.
const float* CacheRowsF32(const Tensor& t, int64_t rows, std::unique_ptr<float[]>& widened) {
  if (t.dtype() == DType::kF32) return t.data<float>();
  const int64_t width = t.dim(1);
  widened = std::make_unique_for_overwrite<float[]>(rows * width);
  ParallelFor(rows, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * width; i < end * width; ++i) widened[i] = Bf16ToF32(t.data<bf16>()[i]);
  });
  return widened.get();
}

// Stores `rows` rows of F32 values into the cache tensor from row `start`, rounding to its dtype.
void WriteCacheRows(const float* src, int64_t rows, int64_t start, Tensor& t) {
  const int64_t width = t.dim(1), n = rows * width;
  if (t.dtype() == DType::kF32) {
    std::memcpy(t.data<float>() + start * width, src, n * sizeof(float));
  } else {
    bf16* dst = t.data<bf16>() + start * width;
    for (int64_t i = 0; i < n; ++i) dst[i] = F32ToBf16(src[i]);
  }
}

int64_t SlotOf(std::span<const int32_t> block_table, int64_t block_size, int64_t position) {
  return block_table[position / block_size] * block_size + position % block_size;
}

// Rows [0, keys) of a sequence as one contiguous cache: the cache itself when its blocks are laid
// out in order from row 0 (a single-block cache, or a lucky allocation), else a copy gathered
// block by block into `gathered`.
const LayerKvCache& ContiguousRows(const LayerKvCache& cache, std::span<const int32_t> block_table,
                                   int64_t block_size, int64_t keys, std::optional<LayerKvCache>& gathered) {
  const int64_t blocks = (keys + block_size - 1) / block_size;
  bool in_order = true;
  for (int64_t b = 0; b < blocks; ++b) in_order = in_order && block_table[b] == b;
  if (in_order) return cache;
  const DType dtype = cache.dtype();
  const size_t elem = DTypeSize(dtype);
  gathered.emplace(LayerKvCache{Tensor(dtype, {keys, cache.c_kv.dim(1)}), Tensor(dtype, {keys, cache.k_pe.dim(1)})});
  for (Tensor LayerKvCache::*part : {&LayerKvCache::c_kv, &LayerKvCache::k_pe}) {
    const Tensor& from = cache.*part;
    Tensor& to = (*gathered).*part;
    const size_t row_bytes = from.dim(1) * elem;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t count = std::min(block_size, keys - b * block_size);
      std::memcpy(static_cast<uint8_t*>(to.raw()) + b * block_size * row_bytes,
                  static_cast<const uint8_t*>(from.raw()) + block_table[b] * block_size * row_bytes, count * row_bytes);
    }
  }
  return *gathered;
}

// Attention with kv_b applied to every cached latent: q [T, H, nope+rope] -> [T, H, v].
void ExpandedAttention(const AttentionWeights& w, const ModelConfig& c, const float* q, int64_t tokens,
                       int64_t start, const LayerKvCache& cache, float* out) {
  const int64_t heads = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t vdim = c.v_head_dim, keys = start + tokens, qk = nope + rope;
  std::unique_ptr<float[]> c_kv_storage, k_pe_storage;
  const float* c_kv = CacheRowsF32(cache.c_kv, keys, c_kv_storage);
  const float* k_pe = CacheRowsF32(cache.k_pe, keys, k_pe_storage);
  const auto kv = std::make_unique_for_overwrite<float[]>(keys * heads * (nope + vdim));
  kernels::Matmul(c_kv, keys, w.kv_b.view(), kv.get());
  const auto k = std::make_unique_for_overwrite<float[]>(keys * heads * qk);
  const auto v = std::make_unique_for_overwrite<float[]>(keys * heads * vdim);
  ParallelFor(keys, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      for (int64_t h = 0; h < heads; ++h) {
        const float* src = kv.get() + (s * heads + h) * (nope + vdim);
        float* kd = k.get() + (s * heads + h) * qk;
        std::memcpy(kd, src, nope * sizeof(float));
        std::memcpy(kd + nope, k_pe + s * rope, rope * sizeof(float));
        std::memcpy(v.get() + (s * heads + h) * vdim, src + nope, vdim * sizeof(float));
      }
    }
  });
  // Keys and values expanded from a BF16 (C16) cache are only that precise: BF16 products lose
  // little more.
  const kernels::AttentionParams p{tokens, keys, heads, qk, vdim, start, static_cast<float>(c.SoftmaxScale()),
                                   cache.dtype() == DType::kBF16};
  kernels::Attention(q, k.get(), v.get(), p, out);
}

// The absorbed form folds W_uk into the query and W_uv into the output. Both run per head on every
// row of the batch at once, so that a step reads each head's weights once, not once per sequence.

// Head h of q [rows, H, nope+rope] -> its columns of q_lat [rows, H, lora] (W_uk[h]^T applied to
// its q_nope) and of q_pe [rows, H, rope].
void AbsorbQueries(const AttentionWeights& w, const ModelConfig& c, const float* q, int64_t rows, int64_t h,
                   float* q_lat, float* q_pe) {
  const int64_t heads = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t lora = c.kv_lora_rank, qk = nope + rope;
  const auto head_in = std::make_unique_for_overwrite<float[]>(rows * nope);
  const auto head_out = std::make_unique_for_overwrite<float[]>(rows * lora);
  CopyColumns(q, rows, heads * qk, h * qk, nope, head_in.get(), nope);
  kernels::Matmul(head_in.get(), rows, w.k_absorb[h].view(), head_out.get());
  CopyColumns(head_out.get(), rows, lora, 0, lora, q_lat + h * lora, heads * lora);
  CopyColumns(q, rows, heads * qk, h * qk + nope, rope, q_pe + h * rope, heads * rope);
}

// Head h of o_lat [rows, H, lora] -> its columns of out [rows, H, v]: W_uv[h] applied.
void AbsorbOutputs(const AttentionWeights& w, const ModelConfig& c, const float* o_lat, int64_t rows, int64_t h,
                   float* out) {
  const int64_t heads = c.num_attention_heads, lora = c.kv_lora_rank, vdim = c.v_head_dim;
  const auto head_in = std::make_unique_for_overwrite<float[]>(rows * lora);
  const auto head_out = std::make_unique_for_overwrite<float[]>(rows * vdim);
  CopyColumns(o_lat, rows, heads * lora, h * lora, lora, head_in.get(), lora);
  kernels::Matmul(head_in.get(), rows, w.v_absorb[h].view(), head_out.get());
  CopyColumns(head_out.get(), rows, vdim, 0, vdim, out + h * vdim, heads * vdim);
}

// One sequence's latent attention, read through its block table, over every head.
kernels::LatentAttentionParams LatentParams(const ModelConfig& c, const MlaSequence& s, int64_t block_size) {
  kernels::LatentAttentionParams p{s.tokens, s.start + s.tokens, c.num_attention_heads, c.kv_lora_rank,
                                   c.qk_rope_head_dim, s.start, static_cast<float>(c.SoftmaxScale())};
  p.block_table = s.block_table.data();
  p.block_size = block_size;
  return p;
}

// The sequence's absorbed queries -> o_lat [tokens, p.heads, lora].
void LatentAttend(const kernels::LatentAttentionParams& p, const float* q_lat, const float* q_pe,
                  const LayerKvCache& cache, float* o_lat) {
  if (cache.dtype() == DType::kF32) {
    kernels::LatentAttention(q_lat, q_pe, cache.c_kv.data<float>(), cache.k_pe.data<float>(), p, o_lat);
  } else {
    kernels::LatentAttention(q_lat, q_pe, cache.c_kv.data<bf16>(), cache.k_pe.data<bf16>(), p, o_lat);
  }
}

// A lone decode token whose attention splits its heads over the threads
// (kernels::LatentAttentionSplitsHeads): each thread takes its heads through the absorbed queries,
// the attention and the absorbed outputs in one parallel loop, not three, so that no thread waits
// for the other twice more a layer. The same bits: a head's results do not depend on which heads
// share its calls.
void AttendLoneToken(const AttentionWeights& w, const ModelConfig& c, const kernels::LatentAttentionParams& p,
                     const float* q, const LayerKvCache& cache, float* out) {
  const int64_t heads = c.num_attention_heads, lora = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  std::vector<float> q_lat(heads * lora), q_pe(heads * rope), o_lat(heads * lora);
  ParallelFor(heads, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) AbsorbQueries(w, c, q, 1, h, q_lat.data(), q_pe.data());
    kernels::LatentAttentionParams some = p;
    some.heads = h1 - h0;
    LatentAttend(some, q_lat.data() + h0 * lora, q_pe.data() + h0 * rope, cache, o_lat.data() + h0 * lora);
    for (int64_t h = h0; h < h1; ++h) AbsorbOutputs(w, c, o_lat.data(), 1, h, out);
  });
}

}  // namespace

void MlaForward(const AttentionWeights& w, const ModelConfig& c, const Rope& rope, const float* x,
                std::span<const MlaSequence> sequences, LayerKvCache& cache, int64_t block_size, float* out) {
  const int64_t heads = c.num_attention_heads, qk = c.qk_head_dim(), lora = c.kv_lora_rank;
  const int64_t rope_dim = c.qk_rope_head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  int64_t rows = 0;
  std::vector<int32_t> positions;
  for (const MlaSequence& s : sequences) {
    MOE_CHECK(static_cast<int64_t>(s.block_table.size()) * block_size >= s.start + s.tokens,
              "block table of %zu blocks too short for position %lld", s.block_table.size(),
              static_cast<long long>(s.start + s.tokens));
    for (int64_t t = 0; t < s.tokens; ++t) positions.push_back(static_cast<int32_t>(s.start + t));
    rows += s.tokens;
  }

  // x's projections: q_a's (or q's) columns, then kv_a's.
  const int64_t projected_width = w.q_kv_a.rows(), q_width = projected_width - (lora + rope_dim);
  std::vector<float> projected(rows * projected_width);
  kernels::Matmul(x, rows, w.q_kv_a.view(), projected.data());
  const auto q = std::make_unique_for_overwrite<float[]>(rows * heads * qk);
  if (c.q_lora_rank) {
    std::vector<float> q_latent(rows * q_width);
    CopyColumns(projected.data(), rows, projected_width, 0, q_width, q_latent.data(), q_width);
    kernels::RmsNorm(q_latent.data(), w.q_a_norm.data<float>(), rows, q_width, eps, q_latent.data());
    kernels::Matmul(q_latent.data(), rows, w.q_b.view(), q.get());
  } else {
    CopyColumns(projected.data(), rows, projected_width, 0, q_width, q.get(), q_width);
  }
  kernels::ApplyRope(q.get() + c.qk_nope_head_dim, rows, heads, heads * qk, qk, positions.data(), rope.params());

  // The new latents, normalized and rotated in F32, then rounded once into the cache.
  std::vector<float> c_kv(rows * lora), k_pe(rows * rope_dim);
  CopyColumns(projected.data(), rows, projected_width, q_width, lora, c_kv.data(), lora);
  CopyColumns(projected.data(), rows, projected_width, q_width + lora, rope_dim, k_pe.data(), rope_dim);
  kernels::RmsNorm(c_kv.data(), w.kv_a_norm.data<float>(), rows, lora, eps, c_kv.data());
  kernels::ApplyRope(k_pe.data(), rows, 1, rope_dim, rope_dim, positions.data(), rope.params());

  // Every sequence's latents go in before any attention reads: a sequence may read blocks that
  // another one of the batch fills (a shared prefix computed this step).
  int64_t row = 0;
  for (const MlaSequence& s : sequences) {
    for (int64_t t = 0; t < s.tokens; ++t, ++row) {
      const int64_t slot = SlotOf(s.block_table, block_size, s.start + t);
      WriteCacheRows(c_kv.data() + row * lora, 1, slot, cache.c_kv);
      WriteCacheRows(k_pe.data() + row * rope_dim, 1, slot, cache.k_pe);
    }
  }

  const int64_t vdim = c.v_head_dim;
  if (sequences.size() == 1 && rows == 1 && sequences[0].form == AttentionForm::kAbsorbed) {
    const kernels::LatentAttentionParams p = LatentParams(c, sequences[0], block_size);
    if (kernels::LatentAttentionSplitsHeads(p)) {
      const auto attn = std::make_unique_for_overwrite<float[]>(heads * vdim);
      AttendLoneToken(w, c, p, q.get(), cache, attn.get());
      kernels::Matmul(attn.get(), rows, w.o_proj.view(), out);
      return;
    }
  }

  // The absorbed sequences' rows one after the other (all rows, when no sequence is expanded), for
  // the per-head GEMMs that fold kv_b into their queries and outputs.
  std::vector<int64_t> first_row(sequences.size()), first_absorbed_row(sequences.size());
  int64_t absorbed_rows = 0;
  for (size_t i = 0, r = 0; i < sequences.size(); r += sequences[i].tokens, ++i) {
    first_row[i] = static_cast<int64_t>(r);
    first_absorbed_row[i] = absorbed_rows;
    if (sequences[i].form == AttentionForm::kAbsorbed) absorbed_rows += sequences[i].tokens;
  }
  // Copies each absorbed sequence's rows of `width` floats between the batch's rows and the
  // absorbed rows.
  auto move_absorbed_rows = [&](const float* from, float* to, int64_t width, bool to_batch) {
    for (size_t i = 0; i < sequences.size(); ++i) {
      if (sequences[i].form != AttentionForm::kAbsorbed) continue;
      const int64_t batch_offset = first_row[i] * width, absorbed_offset = first_absorbed_row[i] * width;
      std::memcpy(to + (to_batch ? batch_offset : absorbed_offset), from + (to_batch ? absorbed_offset : batch_offset),
                  sequences[i].tokens * width * sizeof(float));
    }
  };
  const bool all_absorbed = absorbed_rows == rows;
  std::unique_ptr<float[]> q_lat, q_pe, o_lat;
  if (absorbed_rows > 0) {
    q_lat = std::make_unique_for_overwrite<float[]>(absorbed_rows * heads * lora);
    q_pe = std::make_unique_for_overwrite<float[]>(absorbed_rows * heads * rope_dim);
    o_lat = std::make_unique_for_overwrite<float[]>(absorbed_rows * heads * lora);
    std::unique_ptr<float[]> gathered;
    if (!all_absorbed) {
      gathered = std::make_unique_for_overwrite<float[]>(absorbed_rows * heads * qk);
      move_absorbed_rows(q.get(), gathered.get(), heads * qk, /*to_batch=*/false);
    }
    const float* absorbed_q = all_absorbed ? q.get() : gathered.get();
    ParallelForEach(heads, [&](int64_t h) { AbsorbQueries(w, c, absorbed_q, absorbed_rows, h, q_lat.get(), q_pe.get()); });
  }
  const auto attn = std::make_unique_for_overwrite<float[]>(rows * heads * vdim);
  auto attend = [&](size_t i) {
    const MlaSequence& s = sequences[i];
    if (s.form == AttentionForm::kExpanded) {
      std::optional<LayerKvCache> gathered;
      const LayerKvCache& view = ContiguousRows(cache, s.block_table, block_size, s.start + s.tokens, gathered);
      const int64_t r = first_row[i];
      ExpandedAttention(w, c, q.get() + r * heads * qk, s.tokens, s.start, view, attn.get() + r * heads * vdim);
    } else {
      const int64_t r = first_absorbed_row[i];
      LatentAttend(LatentParams(c, s, block_size), q_lat.get() + r * heads * lora, q_pe.get() + r * heads * rope_dim,
                   cache, o_lat.get() + r * heads * lora);
    }
  };
  // A prompt's attention gets every thread; single-token (decode) sequences run whole, each
  // thread taking the next when it is free, each too little work to split across threads (the
  // kernels give the same bits either way).
  std::vector<size_t> decodes;
  for (size_t i = 0; i < sequences.size(); ++i) {
    if (sequences[i].tokens == 1) {
      decodes.push_back(i);
    } else {
      attend(i);
    }
  }
  ParallelForEach(static_cast<int64_t>(decodes.size()), [&](int64_t j) { attend(decodes[j]); });
  if (absorbed_rows > 0) {
    std::unique_ptr<float[]> absorbed_attn;
    if (!all_absorbed) absorbed_attn = std::make_unique_for_overwrite<float[]>(absorbed_rows * heads * vdim);
    float* to = all_absorbed ? attn.get() : absorbed_attn.get();
    ParallelForEach(heads, [&](int64_t h) { AbsorbOutputs(w, c, o_lat.get(), absorbed_rows, h, to); });
    if (!all_absorbed) move_absorbed_rows(absorbed_attn.get(), attn.get(), heads * vdim, /*to_batch=*/true);
  }
  kernels::Matmul(attn.get(), rows, w.o_proj.view(), out);
}

void MlaForward(const AttentionWeights& w, const ModelConfig& c, const Rope& rope, const float* x, int64_t tokens,
                int64_t start, LayerKvCache& cache, AttentionForm form, float* out) {
  static constexpr int32_t kOneBlock[1] = {0};
  const MlaSequence sequence{tokens, start, kOneBlock, form};
  MlaForward(w, c, rope, x, std::span(&sequence, 1), cache, cache.c_kv.dim(0), out);
}

}  // namespace moe
