// Internals of Int8Gemv (int8_gemv.cc): the per-ISA kernels its driver runs, one table per
// instruction set. The layout they read is int8_gemv.cc's.
#pragma once

#include <cstdint>

#include "kernels/cpu/int8_gemv.h"

namespace moe::kernels::cpu {

inline constexpr int64_t kGemvBlockCols = 64;                 // output columns of a block
inline constexpr int64_t kGemvGroupBytes = 4 * kGemvBlockCols;  // one group of 4 bytes of k for a block
inline constexpr int64_t kGemvLineBytes = 64;                 // a cache line
inline constexpr int kGemvMaxPassRows = 6;
inline constexpr int kGemvMaxSideRows = 3;
inline constexpr int kGemvMaxSideBlocks = 4;

// What finishes a block's sums for a pass's rows: each row's sums less its bias; with scales (null
// for INT32 results), turned into F32 times the row's scale, then times each column's (the block's
// w_scales).
struct GemvFinish {
  const int32_t* bias;
  const float* x_scales;
  const float* w_scales;
};

struct GemvKernels {
  // passes[r - 1]: y[i, 0..cols) (+)= the products of r x rows (`stride` apart) and `runs` runs of
  // `groups` groups of one block, `run_stride` groups apart, read in turns, prefetching from
  // `ahead` on; rows of y n apart. `first` starts the sums, otherwise they add to y's; with
  // `finish`, the block's last pass, they are finished.
  using Pass = void (*)(const int8_t* x, int64_t stride, const uint8_t* w, const uint8_t* ahead, int64_t groups,
                        int64_t runs, int64_t run_stride, bool first, int32_t* y, int64_t n, int64_t cols,
                        const GemvFinish* finish);
  // side_passes[r - 1]: for each of side_blocks[r - 1] blocks w[b], y[b][i, 0..cols[b]) = the
  // products of r x rows and the block over all `groups` groups, the blocks read in turns, less
  // bias[i]; with w_scales (the blocks'), as F32 times x_scales[i], then times each column's scale,
  // as GemvFinish says. Rows of y n apart. block_passes[r - 1]: the same for one block, which with
  // `prefetch` also fetches prefetch_lines cache lines from there into L1 for each group, the
  // lines after the previous group's.
  using SidePass = void (*)(const int8_t* x, int64_t stride, const uint8_t* const* w, int64_t groups,
                            int32_t* const* y, const int64_t* cols, int64_t n, const int32_t* bias,
                            const float* x_scales, const float* const* w_scales, const uint8_t* prefetch,
                            int64_t prefetch_lines);
  // The sum of k bytes of x.
  using RowSum = int32_t (*)(const int8_t* x, int64_t k);

  int pass_rows;  // the most rows a pass takes (<= kGemvMaxPassRows)
  Pass passes[kGemvMaxPassRows];
  RowSum row_sum;
  int side_rows = 0;  // the most rows a side pass takes (0: the kernels have none)
  int side_blocks[kGemvMaxSideRows] = {};  // <= kGemvMaxSideBlocks
  SidePass side_passes[kGemvMaxSideRows] = {};
  SidePass block_passes[kGemvMaxPassRows] = {};  // set wherever side_rows > 0
  // one_row_passes[b - 1]: side_passes[0] over b blocks, for the blocks a range leaves past its
  // parts at one row (set wherever side_rows > 0).
  SidePass one_row_passes[kGemvMaxSideBlocks] = {};
};

const GemvKernels& Avx512VnniGemvKernels();
const GemvKernels& AvxVnniGemvKernels();
const GemvKernels& Avx2GemvKernels();

}  // namespace moe::kernels::cpu
