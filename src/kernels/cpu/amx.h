// AMX tiles, for files whose functions carry MOE_AMX: every kernel here configures all eight tiles
// the same way, 16 rows of 64 bytes (16 x 32 BF16 operands, 16 x 16 F32 accumulators).
#pragma once

#if defined(__x86_64__)

#include <cstdint>

#include "kernels/cpu/avx512.h"

#define MOE_AMX __attribute__((target("amx-tile,amx-bf16")))
#define MOE_AMX_TILE __attribute__((target("amx-tile")))

namespace moe::kernels::cpu {

inline constexpr int64_t kAmxRows = 16;  // rows of a tile
inline constexpr int64_t kAmxK = 32;     // BF16 values in a row of an A tile: one TDPBF16PS step of k
inline constexpr int64_t kAmxTileValues = kAmxRows * kAmxK;  // BF16 values in one A or B tile

// LDTILECFG's 64-byte operand: palette 1, every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// Tiles 0-3, where every kernel here accumulates, set to zero.
MOE_AMX_TILE inline void ZeroAccumulators() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

}  // namespace moe::kernels::cpu

#endif
