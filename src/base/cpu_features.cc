#include "base/cpu_features.h"

#include <cstdio>
#include <cstdlib>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace moe {
namespace {

#if defined(__x86_64__)
// AMX-TILE, AMX-BF16 and AMX-INT8 are CPUID leaf 7 EDX bits 24, 22 and 25. Linux (5.16+) keeps the
// 8 KiB tile state off until a process asks for it with arch_prctl(ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA); a tile instruction without that leave is killed with SIGILL.
bool HasAmx(int dot_product_bit) {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if (!(edx & (1u << 24)) || !(edx & (1u << dot_product_bit))) return false;
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

}  // namespace

std::string CpuFeatures::ToString() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vnni, "avx512vnni");
  add(avx512bf16, "avx512bf16");
  add(avxvnni, "avxvnni");
  add(amx_bf16, "amx_bf16");
  add(amx_int8, "amx_int8");
  return s.empty() ? "generic" : s;
}

std::optional<IsaTier> ParseIsaTier(std::string_view name) {
  if (name == "generic") return IsaTier::kGeneric;
  if (name == "avx2") return IsaTier::kAvx2;
  if (name == "avx512") return IsaTier::kAvx512;
  if (name == "amx") return IsaTier::kAmx;
  return std::nullopt;
}

CpuFeatures CapFeatures(CpuFeatures f, IsaTier cap) {
  if (cap < IsaTier::kAmx) f.amx_bf16 = f.amx_int8 = false;
  if (cap < IsaTier::kAvx512) f.avx512f = f.avx512bw = f.avx512vnni = f.avx512bf16 = false;
  if (cap < IsaTier::kAvx2) f.avx2 = f.fma = f.avxvnni = false;
  return f;
}

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
#if defined(__x86_64__)
    __builtin_cpu_init();
    f.amd = __builtin_cpu_is("amd");
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    f.avx512f = __builtin_cpu_supports("avx512f");
    f.avx512bw = __builtin_cpu_supports("avx512bw");
    f.avx512vnni = __builtin_cpu_supports("avx512vnni");
    f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
    // AVX-VNNI is CPUID leaf 7, sub-leaf 1, EAX bit 4; older compilers' __builtin_cpu_supports
    // does not know its name.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    f.avxvnni = __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4));
    f.amx_bf16 = HasAmx(22);
    f.amx_int8 = HasAmx(25);
#endif
    const char* cap = std::getenv("MOE_MAX_ISA");
    if (cap == nullptr || *cap == '\0') return f;
    const std::optional<IsaTier> tier = ParseIsaTier(cap);
    if (!tier) {
      std::fprintf(stderr, "MOE_MAX_ISA=%s: expected generic, avx2, avx512 or amx\n", cap);
      std::exit(2);
    }
    return CapFeatures(f, *tier);
  }();
  return features;
}

}  // namespace moe
