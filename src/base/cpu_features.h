// The x86-64 ISA extensions the kernels choose between, detected once at start-up.
#pragma once

#include <optional>
#include <string>
#include <string_view>

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
  // Made by AMD: not an instruction set, but how the kernels best stream memory differs between the
  // vendors' prefetchers (int8_gemv.cc).
  bool amd = false;

  std::string ToString() const;
};

// The instruction-set tiers the kernels come in, lowest first.
enum class IsaTier { kGeneric, kAvx2, kAvx512, kAmx };

// Parses a MOE_MAX_ISA value: "generic", "avx2", "avx512" or "amx". Empty: nullopt.
std::optional<IsaTier> ParseIsaTier(std::string_view name);

// `detected` with every feature above `cap` cleared: the kernels, and oneDNN, then run as on a CPU
// that has no more (the way to run and test a lower tier's kernels on a machine that has more).
CpuFeatures CapFeatures(CpuFeatures detected, IsaTier cap);

// What the CPU has, detected once, capped by the environment variable MOE_MAX_ISA if set (an
// unknown value stops the process with a message naming it).
const CpuFeatures& GetCpuFeatures();

}  // namespace moe
