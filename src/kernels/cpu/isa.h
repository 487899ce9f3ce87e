// The instruction sets the CPU kernels come in. Each kernel picks the best one the machine runs
// once; tests and benchmarks name one to run every variant the machine supports.
#pragma once

namespace moe::kernels::cpu {

enum class Isa { kGeneric, kAvx2, kAvx512, kAmx };

bool IsaSupported(Isa isa);

}  // namespace moe::kernels::cpu
