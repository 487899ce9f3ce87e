// Int8Gemv: INT32 products of a few I8 activation rows and a weight packed for it, for decode,
// which reads every weight once per step and so is bound by memory bandwidth.
//
// Kernels for AVX-512 VNNI, AVX2 with AVX-VNNI and AVX2 alone (int8_gemv_avx512.cc,
// int8_gemv_avx2.cc) read the same layout and give the same products; the best the CPU runs is
// chosen once.
//
// VPDPBUSD multiplies unsigned bytes by signed ones. The packed weight is made unsigned by flipping
// its sign bit (w + 128) and x stays signed, so each product is too large by 128 * x[i, p]; 128
// times the sum of each x row (Int8RowBiases), found once per call, is taken off at the end. The biased sums, at
// most 255 * 128 * k, stay within INT32 for k up to 2^16, so the result is exact, whatever the
// order.
//
// Layout. For each block of 64 output columns (weight rows, zero past n) and each group of 4 bytes
// of k (zero past k), 256 bytes: column j's 4 bytes at 4 j. One VPDPBUSD multiplies 16 columns'
// groups by one x row's group broadcast to every lane, and its lanes are 16 outputs: nothing to
// reduce at the end, and a block is one stream through memory.
//
// Blocking. A pass takes up to the kernels' pass_rows x rows (6 on AVX-512, 1 on AVX2, as many as
// the registers hold sums for) against one block over a chunk of k (32 KiB of weight, which stays
// in L1 for the chunk's later passes), the first pass prefetching ahead; partial sums wait in y
// between chunks, and the block's last passes finish them from the registers (the bias off, the
// scales on) rather than leaving them for another pass over y: the batch-1 step ~1% less time, the
// 32-way step ~0.7%. Threads split the blocks.
//
// Two streams. A chunk is two runs of groups, one from each half of the block's k, read in turns,
// so that each thread streams from two places in memory at once: on the AMX Xeon measured, two
// threads of a synthetic loop with 4 VPDPBUSDs a line read 24.4-25.2 GB/s from one place each and
// 27.6-29.4 from two (the halves of 128 KiB to 2 MiB blocks), and the 32-sequence decode step's
// experts took ~5% less time (bench/RESULTS.md). INT32 sums are exact in any order, so the
// products do not change.
//
// Blocks side by side (GemvStreams::kSideBySide). On the AMD EPYC measured, the halves of each
// block did worse than whole blocks read side by side: a thread's blocks in equal parts of its
// range, the j-th block of each part read together over its whole k, nothing prefetched (the
// blocks of a part lie end to end, so each part is one stream through memory). A synthetic loop of
// two threads read 56.8 GB/s from the halves of 64 KiB with the prefetch and 64.5 from two long
// runs without; Int8Gemv at 1 row 46.5 -> 56.6 GB/s on a 512 MiB weight, 48.0 -> 55.3 on expert
// shapes, and the batch-1 decode step took 8-10% less time with two parts. Four streams a thread
// read faster again than two (a synthetic loop: 54.0-67.8 GB/s against 50.6-57.8) and took the
// batch-1 step 2-3% less time, but a block's sums take 4 vectors a row, so four parts only at 1
// row, two at 2 and 3 rows (three at 2 rows measured no faster). More rows read one block at a
// time, whole, with no prefetch either, each pass's rows in turn (a block is 64 k bytes, 128 KiB
// for bench-3b's experts, so its later passes read it from L2): 64 experts of bench-3b's shape,
// one a thread, read 48.4 / 47.0 / 40.6 GB/s so at 4 / 5 / 6 rows against 37.0 / 35.6 / 31.4 from
// the halves, and at 8-12 rows 11-16% faster than the halves' passes over chunks; the 32-way
// decode step took ~5-7% less time (bench/RESULTS.md). The Xeons measured before keep the halves.
//
// A lone pass of 4-6 rows streams its block with a prefetch 4 KiB ahead after all: 64 of bench-3b's
// experts read 7-10% faster so (the gate), 18-28% (the down, of 64 KiB blocks), and the 8-32-way
// decode steps took 1-2.5% less time; at 1-3 rows (side passes) the same prefetch cost the batch-1
// step 7% (bench/RESULTS.md).
//
// Past six rows a block takes several passes, the first from memory, the later ones from L2 and
// bound by arithmetic; those later passes bring the range's next block into the cache between their
// groups, a part each, so that its first pass does not wait on memory either. At 32 rows the
// bench-3b lm_head took 12.2 ms against 14.2, its attention projections 9-14% less time, and the
// 32-way decode step 4.5-5% less (bench/RESULTS.md).
#include "kernels/cpu/int8_gemv.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "base/check.h"
#include "base/cpu_features.h"
#include "base/int_math.h"
#include "base/thread_pool.h"
#include "kernels/cpu/int8_gemv_kernels.h"

namespace moe::kernels::cpu {
namespace {

constexpr int64_t kStreams = 2;                          // runs of a chunk, from as many places in k
constexpr int64_t kRunGroups = 128 / kStreams;           // a chunk's run: 32 KiB of a block in all
constexpr int64_t kPrefetchAhead = 8 * kGemvGroupBytes;  // 2 KiB: measured best of 0, 2, 8, 32 KiB
// How far a lone pass of 4-6 rows prefetches ahead of its block's stream: 4 KiB, measured best of
// 1, 2, 4, 8 KiB (8 within noise).
constexpr int64_t kStreamAhead = 16 * kGemvGroupBytes;

#if defined(__x86_64__)
const GemvKernels& KernelsFor(GemvIsa isa) {
  MOE_CHECK(GemvIsaSupported(isa), "Int8Gemv: this CPU cannot run the instruction set asked for");
  switch (isa) {
    case GemvIsa::kAvx2: return Avx2GemvKernels();
    case GemvIsa::kAvxVnni: return AvxVnniGemvKernels();
    case GemvIsa::kAvx512Vnni: return Avx512VnniGemvKernels();
  }
  return Avx2GemvKernels();
}

// The blocks of output columns a call computes on the calling thread; without one, a call computes
// every block, on every thread.
struct BlockRange {
  int64_t begin, end;
};

// Int8Gemv, and with x_scales (and w_scales) Int8GemvScaled, whose F32 results go over y's storage
// block by block while the block is in cache.
void Products(const GemvKernels& kernels, GemvStreams streams, const int8_t* x, int64_t m, const uint8_t* packed,
              int64_t n, int64_t k, const float* x_scales, const float* w_scales, int32_t* y,
              const BlockRange* only = nullptr) {
  if (m == 0) return;
  std::vector<int32_t> bias(m);
  for (int64_t i = 0; i < m; ++i) bias[i] = 128 * kernels.row_sum(x + i * k, k);
  // Rows whose k is not a whole number of groups are read from a copy padded with zeros.
  const int64_t stride = RoundUp(k, 4);
  std::vector<int8_t> padded;
  if (stride != k) {
    padded.assign(m * stride, 0);
    for (int64_t i = 0; i < m; ++i) std::memcpy(&padded[i * stride], x + i * k, k);
    x = padded.data();
  }
  const int64_t groups = stride / 4;
  // Passes of equal rows: 8 rows as 4 + 4 rather than 6 + 2.
  const int64_t pass_rows = CeilDiv(m, CeilDiv(m, int64_t{kernels.pass_rows}));
  auto block = [&](int64_t b) { return packed + b * groups * kGemvGroupBytes; };
  auto columns = [&](int64_t b) { return std::min(kGemvBlockCols, n - b * kGemvBlockCols); };
  // Block b in chunks, each chunk's kStreams runs, [g, g + run) of each kStreams-th of k, then the
  // groups left over as one.
  auto halves = [&](int64_t b) {
    const int64_t col = b * kGemvBlockCols, part = groups / kStreams;
    // The block's last passes finish its sums.
    auto passes = [&](int64_t g, int64_t run, int64_t runs, bool last) {
      const uint8_t* w = block(b) + g * kGemvGroupBytes;
      for (int64_t i = 0; i < m; i += pass_rows) {
        const int64_t rows = std::min(pass_rows, m - i);
        const GemvFinish finish{bias.data() + i, x_scales ? x_scales + i : nullptr, x_scales ? w_scales + col : nullptr};
        // Prefetching past the end of `packed` is harmless: a prefetch never faults.
        kernels.passes[rows - 1](x + i * stride + 4 * g, stride, w, i == 0 ? w + kPrefetchAhead : w, run, runs, part,
                                 g == 0, y + i * n + col, n, columns(b), last ? &finish : nullptr);
      }
    };
    const bool leftover = kStreams * part < groups;
    for (int64_t g = 0; g < part; g += kRunGroups) {
      passes(g, std::min(kRunGroups, part - g), kStreams, !leftover && g + kRunGroups >= part);
    }
    if (leftover) passes(kStreams * part, groups - kStreams * part, 1, true);
  };
  // Side passes over `together` blocks b[p] (block_passes over one), for rows [i, i + rows).
  auto side_pass = [&](GemvKernels::SidePass pass, int64_t i, const int64_t* b, int64_t together,
                       const uint8_t* prefetch = nullptr, int64_t prefetch_lines = 0) {
    const uint8_t* w[kGemvMaxSideBlocks];
    int32_t* out[kGemvMaxSideBlocks];
    int64_t cols[kGemvMaxSideBlocks];
    const float* scales[kGemvMaxSideBlocks];
    for (int64_t p = 0; p < together; ++p) {
      const int64_t col = b[p] * kGemvBlockCols;
      w[p] = block(b[p]);
      out[p] = y + i * n + col;
      cols[p] = columns(b[p]);
      scales[p] = x_scales ? w_scales + col : nullptr;
    }
    pass(x + i * stride, stride, w, groups, out, cols, n, bias.data() + i, x_scales ? x_scales + i : nullptr,
         x_scales ? scales : nullptr, prefetch, prefetch_lines);
  };
  const bool side = streams == GemvStreams::kSideBySide && kernels.side_rows > 0;
  auto run_blocks = [&](int64_t begin, int64_t end) {
    if (!side) {
      for (int64_t b = begin; b < end; ++b) halves(b);
      return;
    }
    if (m > kernels.side_rows) {
      // One block at a time, whole, each pass's rows in turn (the block's later passes from L2).
      // A lone pass prefetches kStreamAhead ahead of itself (past `packed` too: a prefetch never
      // faults); of several, the later ones fetch the range's next block between them, `lines` a
      // group each.
      const int64_t passes = CeilDiv(m, pass_rows), lines = passes >= 5 ? 1 : passes >= 3 ? 2 : 4;
      const int64_t part_bytes = lines * kGemvLineBytes * groups;
      for (int64_t b = begin; b < end; ++b) {
        if (passes == 1) {
          side_pass(kernels.block_passes[m - 1], 0, &b, 1, block(b) + kStreamAhead, kGemvGroupBytes / kGemvLineBytes);
          continue;
        }
        for (int64_t i = 0, p = 0; i < m; i += pass_rows, ++p) {
          const bool fetches = b + 1 < end && p > 0 && (p - 1) * part_bytes < groups * kGemvGroupBytes;
          const uint8_t* next = fetches ? block(b + 1) + (p - 1) * part_bytes : nullptr;
          side_pass(kernels.block_passes[std::min(pass_rows, m - i) - 1], i, &b, 1, next, lines);
        }
      }
      return;
    }
    // The range's first `together` parts of `part` blocks, the j-th block of each read side by
    // side; the blocks past them side by side too at one row, else alone.
    const int64_t together = kernels.side_blocks[m - 1], part = (end - begin) / together;
    for (int64_t j = begin; j < begin + part; ++j) {
      int64_t b[kGemvMaxSideBlocks];
      for (int64_t p = 0; p < together; ++p) b[p] = j + p * part;
      side_pass(kernels.side_passes[m - 1], 0, b, together);
    }
    const int64_t past = begin + together * part;
    if (m == 1 && past < end) {
      int64_t b[kGemvMaxSideBlocks];
      for (int64_t p = 0; p < end - past; ++p) b[p] = past + p;
      side_pass(kernels.one_row_passes[end - past - 1], 0, b, end - past);
      return;
    }
    for (int64_t b = past; b < end; ++b) side_pass(kernels.block_passes[m - 1], 0, &b, 1);
  };
  if (only) {
    run_blocks(only->begin, only->end);
    return;
  }
  // Where blocks are read side by side, the threads claim shrinking ranges (at least a side pass's
  // blocks): with fixed halves the batch-1 step waited ~10% of each GEMV's time for the slower
  // core; claimed, it took ~2% less time, the 4-sequence step 0-4% less (bench/RESULTS.md).
  if (side) {
    ParallelForShrinking(CeilDiv(n, kGemvBlockCols), m <= kernels.side_rows ? kernels.side_blocks[m - 1] : 1,
                         run_blocks);
  } else {
    ParallelFor(CeilDiv(n, kGemvBlockCols), run_blocks);
  }
}
#endif

}  // namespace

bool GemvIsaSupported(GemvIsa isa) {
  const CpuFeatures& f = GetCpuFeatures();
  switch (isa) {
    case GemvIsa::kAvx2: return f.avx2;
    case GemvIsa::kAvxVnni: return f.avx2 && f.avxvnni;
    case GemvIsa::kAvx512Vnni: return f.avx512f && f.avx512bw && f.avx512vnni;
  }
  return false;
}

bool Int8GemvSupported() { return GemvIsaSupported(GemvIsa::kAvx2) || GemvIsaSupported(GemvIsa::kAvx512Vnni); }

GemvStreams BestGemvStreams() {
  return GetCpuFeatures().amd ? GemvStreams::kSideBySide : GemvStreams::kBlockHalves;
}

GemvIsa BestGemvIsa() {
  MOE_CHECK(Int8GemvSupported(), "Int8Gemv: this CPU has neither AVX2 nor AVX-512 VNNI");
  static const GemvIsa best = GemvIsaSupported(GemvIsa::kAvx512Vnni) ? GemvIsa::kAvx512Vnni
                              : GemvIsaSupported(GemvIsa::kAvxVnni)  ? GemvIsa::kAvxVnni
                                                                     : GemvIsa::kAvx2;
  return best;
}

int64_t Int8GemvMaxRowsFor(int64_t n, int64_t k) {
  switch (BestGemvIsa()) {
    case GemvIsa::kAvx2:
    case GemvIsa::kAvxVnni: return std::numeric_limits<int64_t>::max();
    case GemvIsa::kAvx512Vnni:
      if (Int8GemmAmxSupported(k, n)) return kInt8GemvMaxRowsBesideAmx;
      return BestGemvStreams() == GemvStreams::kSideBySide ? kInt8GemvMaxRowsSideBySide : kInt8GemvMaxRows;
  }
  return kInt8GemvMaxRows;
}

int64_t Int8GemvPackedBytes(int64_t n, int64_t k) { return RoundUp(n, kGemvBlockCols) * RoundUp(k, 4); }

void PackInt8Gemv(const int8_t* w, int64_t n, int64_t k, uint8_t* packed) {
  const int64_t groups = CeilDiv(k, 4);
  ParallelFor(CeilDiv(n, kGemvBlockCols), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t g = 0; g < groups; ++g) {
        uint8_t* group = packed + (b * groups + g) * kGemvGroupBytes;
        for (int64_t j = 0; j < kGemvBlockCols; ++j) {
          for (int64_t q = 0; q < 4; ++q) {
            const int64_t col = b * kGemvBlockCols + j, p = 4 * g + q;
            const int8_t value = col < n && p < k ? w[col * k + p] : 0;
            group[4 * j + q] = static_cast<uint8_t>(value) ^ 0x80;
          }
        }
      }
    }
  });
}

#if defined(__x86_64__)
void Int8RowBiases(const int8_t* x, int64_t m, int64_t k, int32_t* biases) {
  const GemvKernels& kernels = KernelsFor(BestGemvIsa());
  for (int64_t i = 0; i < m; ++i) biases[i] = 128 * kernels.row_sum(x + i * k, k);
}

void Int8Gemv(GemvIsa isa, GemvStreams streams, const int8_t* x, int64_t m, const uint8_t* packed, int64_t n,
              int64_t k, int32_t* y) {
  Products(KernelsFor(isa), streams, x, m, packed, n, k, nullptr, nullptr, y);
}

void Int8GemvScaled(GemvIsa isa, GemvStreams streams, const int8_t* x, const float* x_scales, int64_t m,
                    const uint8_t* packed, int64_t n, int64_t k, const float* w_scales, float* y) {
  static_assert(sizeof(int32_t) == sizeof(float));
  Products(KernelsFor(isa), streams, x, m, packed, n, k, x_scales, w_scales, reinterpret_cast<int32_t*>(y));
}

void Int8GemvScaledBlocks(const int8_t* x, const float* x_scales, int64_t m, const uint8_t* packed, int64_t n,
                          int64_t k, const float* w_scales, int64_t block_begin, int64_t block_end, float* y) {
  MOE_CHECK(0 <= block_begin && block_begin <= block_end && block_end <= CeilDiv(n, kGemvBlockCols),
            "Int8GemvScaledBlocks: blocks [%lld, %lld) of %lld columns", static_cast<long long>(block_begin),
            static_cast<long long>(block_end), static_cast<long long>(n));
  const BlockRange only{block_begin, block_end};
  Products(KernelsFor(BestGemvIsa()), BestGemvStreams(), x, m, packed, n, k, x_scales, w_scales,
           reinterpret_cast<int32_t*>(y), &only);
}
#else
void Int8RowBiases(const int8_t*, int64_t, int64_t, int32_t*) { MOE_CHECK(false, "Int8RowBiases needs x86-64"); }

void Int8Gemv(GemvIsa, GemvStreams, const int8_t*, int64_t, const uint8_t*, int64_t, int64_t, int32_t*) {
  MOE_CHECK(false, "Int8Gemv needs x86-64");
}

void Int8GemvScaled(GemvIsa, GemvStreams, const int8_t*, const float*, int64_t, const uint8_t*, int64_t, int64_t,
                    const float*, float*) {
  MOE_CHECK(false, "Int8Gemv needs x86-64");
}

void Int8GemvScaledBlocks(const int8_t*, const float*, int64_t, const uint8_t*, int64_t, int64_t, const float*,
                          int64_t, int64_t, float*) {
  MOE_CHECK(false, "Int8Gemv needs x86-64");
}
#endif

void Int8Gemv(const int8_t* x, int64_t m, const uint8_t* packed, int64_t n, int64_t k, int32_t* y) {
  Int8Gemv(BestGemvIsa(), BestGemvStreams(), x, m, packed, n, k, y);
}

void Int8GemvScaled(const int8_t* x, const float* x_scales, int64_t m, const uint8_t* packed, int64_t n, int64_t k,
                    const float* w_scales, float* y) {
  Int8GemvScaled(BestGemvIsa(), BestGemvStreams(), x, x_scales, m, packed, n, k, w_scales, y);
}

}  // namespace moe::kernels::cpu
