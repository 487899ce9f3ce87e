#include "kernels/cpu/isa.h"

#include "base/cpu_features.h"

namespace moe::kernels::cpu {

bool IsaSupported(Isa isa) {
  const CpuFeatures& cpu = GetCpuFeatures();
  switch (isa) {
    case Isa::kGeneric: return true;
    case Isa::kAvx2: return cpu.avx2 && cpu.fma;
    case Isa::kAvx512: return cpu.avx512f;
    case Isa::kAmx: return cpu.avx512f && cpu.avx512bw && cpu.amx_bf16;
  }
  return false;
}

}  // namespace moe::kernels::cpu
