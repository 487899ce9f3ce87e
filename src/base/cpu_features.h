// The x86-64 ISA extensions the kernels choose between, detected once at start-up.
#pragma once

#include <string>

namespace moe {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool avxvnni = false;
  // AMX tiles with BF16 dot products, and the kernel's leave to use them (Linux grants the tile
  // state per process on request; detection asks).
  bool amx_bf16 = false;
  bool amx_int8 = false;  // AMX tiles with INT8 dot products (and the same leave)

  std::string ToString() const;
};

const CpuFeatures& GetCpuFeatures();

}  // namespace moe
