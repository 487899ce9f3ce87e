#include "roofline.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "base/cpu_features.h"
#include "base/thread_pool.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/isa.h"
#include "tensor/dtype.h"

namespace moe::bench {
namespace {

double Seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// --- Read bandwidth -------------------------------------------------------------------------------

// 512 MiB: far beyond any cache of the machines this runs on, so every pass streams from DRAM.
constexpr int64_t kStreamBytes = int64_t{512} << 20;

uint64_t SumGeneric(const uint64_t* p, int64_t n) {
  uint64_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += p[i];
  return s;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t SumAvx512(const uint64_t* p, int64_t n) {
  // Four accumulators, each over its own quarter of the slice: a thread reading from four places at
  // once gets more from memory on the machines measured than from one (31.2-32.1 against 29.0-29.2
  // GB/s on two threads of the AMX Xeon, bench/RESULTS.md), and Int8Gemv reads its weights so.
  const int64_t quarter = n / 32 * 8;
  const uint64_t* q[4] = {p, p + quarter, p + 2 * quarter, p + 3 * quarter};
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < quarter; i += 8) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(q[0] + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(q[1] + i));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(q[2] + i));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(q[3] + i));
  }
  const __m512i sum = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, sum);
  return SumGeneric(lanes, 8) + SumGeneric(p + 4 * quarter, n - 4 * quarter);
}
#endif

struct StreamBuffer {
  StreamBuffer() : words(kStreamBytes / 8), data(static_cast<uint64_t*>(std::aligned_alloc(64, kStreamBytes))) {
    // First touch from the threads that read it, so pages land where they are used.
    ParallelFor(words, [&](int64_t begin, int64_t end) { std::fill(data.get() + begin, data.get() + end, 1); });
  }
  struct Free {
    void operator()(uint64_t* p) const { std::free(p); }
  };
  int64_t words;
  std::unique_ptr<uint64_t, Free> data;
};

StreamBuffer& Stream() {
  static StreamBuffer buffer;
  return buffer;
}

uint64_t ReadPass() {
  static const auto sum = GetCpuFeatures().avx512f ? SumAvx512 : SumGeneric;
  StreamBuffer& b = Stream();
  const int threads = DefaultThreadPool().num_threads();
  std::vector<uint64_t> partial(threads);
  // One contiguous slice per thread, 64-byte aligned.
  const int64_t slice = b.words / threads / 8 * 8;
  ParallelFor(threads, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) partial[t] = sum(b.data.get() + t * slice, slice);
  });
  uint64_t total = 0;
  for (uint64_t s : partial) total += s;
  return total;
}

// --- Arithmetic peaks -----------------------------------------------------------------------------
// Each loop runs `iters` rounds of kChains independent multiply-add chains on every thread, enough
// chains to cover the instruction latency on two pipes, and returns the operations done per thread
// (a multiply-add counts two). The operands come from memory the compiler cannot see through, so
// nothing is folded away, and a lane of their sum is written back to it for the same reason.

constexpr int kChains = 12;

struct PeakLoop {
  const char* isa;
  double (*run)(int64_t iters);
};

#if defined(__x86_64__)
volatile int32_t g_operand = 0x01020304;

__attribute__((target("avx512f,avx512bw,avx512vnni"))) double Int8Vnni512(int64_t iters) {
  const __m512i a = _mm512_set1_epi32(g_operand), b = _mm512_set1_epi32(g_operand);
  __m512i acc[kChains];
  for (__m512i& c : acc) c = _mm512_setzero_si512();
  for (int64_t i = 0; i < iters; ++i) {
    for (__m512i& c : acc) c = _mm512_dpbusd_epi32(c, a, b);  // 64 u8 x s8 products per lane set
  }
  __m512i s = acc[0];
  for (int j = 1; j < kChains; ++j) s = _mm512_add_epi32(s, acc[j]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, s);
  g_operand = lanes[0] & 0x7f7f7f7f;
  return 2.0 * 64 * kChains * static_cast<double>(iters);
}

__attribute__((target("avx2"))) double Int8Avx2(int64_t iters) {
  // vpmaddubsw (pairs of u8 x s8 -> s16) + vpmaddwd by ones (-> s32) + vpaddd: 32 products. The
  // products do not depend on the accumulator, so each chain gets its own operand, hidden from the
  // compiler every round, or it would compute the product once and only add.
  constexpr int kAvx2Chains = 6;  // 6 operands + 6 accumulators + 2 constants fit 16 registers
  const __m256i b = _mm256_set1_epi32(g_operand), ones = _mm256_set1_epi16(1);
  __m256i a[kAvx2Chains], acc[kAvx2Chains];
  for (int j = 0; j < kAvx2Chains; ++j) {
    a[j] = _mm256_set1_epi32(g_operand + j);
    acc[j] = _mm256_setzero_si256();
  }
  for (int64_t i = 0; i < iters; ++i) {
    for (int j = 0; j < kAvx2Chains; ++j) {
      asm volatile("" : "+x"(a[j]));
      acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(a[j], b), ones));
    }
  }
  __m256i s = acc[0];
  for (int j = 1; j < kAvx2Chains; ++j) s = _mm256_add_epi32(s, acc[j]);
  g_operand = _mm256_extract_epi32(s, 0) & 0x7f7f7f7f;
  return 2.0 * 32 * kAvx2Chains * static_cast<double>(iters);
}

// AVX-VNNI's 256-bit vpdpbusd, VEX-encoded, as Int8Gemv issues it (int8_gemv_avx2.cc).
__attribute__((target("avx2"))) double Int8AvxVnni(int64_t iters) {
  const __m256i a = _mm256_set1_epi32(g_operand), b = _mm256_set1_epi32(g_operand);
  __m256i acc[kChains];
  for (__m256i& c : acc) c = _mm256_setzero_si256();
  for (int64_t i = 0; i < iters; ++i) {
    for (__m256i& c : acc) asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(c) : "x"(a), "x"(b));
  }
  __m256i s = acc[0];
  for (int j = 1; j < kChains; ++j) s = _mm256_add_epi32(s, acc[j]);
  g_operand = _mm256_extract_epi32(s, 0) & 0x7f7f7f7f;
  return 2.0 * 32 * kChains * static_cast<double>(iters);
}

volatile float g_float_operand = 1.0f;

__attribute__((target("avx512f"))) double F32Avx512(int64_t iters) {
  const __m512 a = _mm512_set1_ps(g_float_operand), b = _mm512_set1_ps(g_float_operand * 1e-9f);
  __m512 acc[kChains];
  for (__m512& c : acc) c = _mm512_setzero_ps();
  for (int64_t i = 0; i < iters; ++i) {
    for (__m512& c : acc) c = _mm512_fmadd_ps(a, b, c);
  }
  __m512 s = acc[0];
  for (int j = 1; j < kChains; ++j) s = _mm512_add_ps(s, acc[j]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  g_float_operand = 1.0f + 1e-30f * lanes[0];
  return 2.0 * 16 * kChains * static_cast<double>(iters);
}

__attribute__((target("avx2,fma"))) double F32Avx2(int64_t iters) {
  const __m256 a = _mm256_set1_ps(g_float_operand), b = _mm256_set1_ps(g_float_operand * 1e-9f);
  __m256 acc[kChains];
  for (__m256& c : acc) c = _mm256_setzero_ps();
  for (int64_t i = 0; i < iters; ++i) {
    for (__m256& c : acc) c = _mm256_fmadd_ps(a, b, c);
  }
  __m256 s = acc[0];
  for (int j = 1; j < kChains; ++j) s = _mm256_add_ps(s, acc[j]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  g_float_operand = 1.0f + 1e-30f * lanes[0];
  return 2.0 * 8 * kChains * static_cast<double>(iters);
}

__attribute__((target("avx512f,avx512bf16"))) double Bf16Avx512(int64_t iters) {
  const __m512 x = _mm512_set1_ps(g_float_operand);
  const __m512bh a = _mm512_cvtne2ps_pbh(x, x), b = a;
  __m512 acc[kChains];
  for (__m512& c : acc) c = _mm512_setzero_ps();
  for (int64_t i = 0; i < iters; ++i) {
    for (__m512& c : acc) c = _mm512_dpbf16_ps(c, a, b);  // 32 bf16 products per instruction
  }
  __m512 s = acc[0];
  for (int j = 1; j < kChains; ++j) s = _mm512_add_ps(s, acc[j]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  g_float_operand = 1.0f + 1e-30f * lanes[0];
  return 2.0 * 32 * kChains * static_cast<double>(iters);
}

// Four accumulator tiles of 16 x 16 outputs on every step, the AMX loops' shape: TDPBF16PS (32
// BF16 products an output) or TDPBSSD (64 INT8 ones, the tiles Int8GemmAmx runs prompts on).
template <bool kInt8>
__attribute__((target("amx-tile,amx-bf16,amx-int8"))) double Amx(int64_t iters) {
  static const kernels::cpu::TileConfig config;
  alignas(64) static uint8_t operand[kernels::cpu::kAmxRows * 64];  // 64 bytes a row either way
  alignas(64) static uint32_t result[kernels::cpu::kAmxRows * kernels::cpu::kAmxRows];
  _tile_loadconfig(&config);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iters; ++i) {
    if constexpr (kInt8) {
      _tile_dpbssd(0, 4, 5);
      _tile_dpbssd(1, 4, 5);
      _tile_dpbssd(2, 4, 5);
      _tile_dpbssd(3, 4, 5);
    } else {
      _tile_dpbf16ps(0, 4, 5);
      _tile_dpbf16ps(1, 4, 5);
      _tile_dpbf16ps(2, 4, 5);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, result, 64);
  _tile_release();
  benchmark::DoNotOptimize(result);
  const int64_t products = kInt8 ? 64 : 32;
  return 2.0 * 4 * kernels::cpu::kAmxRows * kernels::cpu::kAmxRows * products * static_cast<double>(iters);
}
#endif

PeakLoop Int8Loop() {
#if defined(__x86_64__)
  const CpuFeatures& f = GetCpuFeatures();
  if (f.avx512vnni && f.avx512bw) return {"avx512vnni vpdpbusd", Int8Vnni512};
  if (f.avxvnni) return {"avx-vnni vpdpbusd", Int8AvxVnni};
  if (f.avx2) return {"avx2 vpmaddubsw", Int8Avx2};
#endif
  return {"none", nullptr};
}

PeakLoop F32Loop() {
#if defined(__x86_64__)
  const CpuFeatures& f = GetCpuFeatures();
  if (f.avx512f) return {"avx512f vfmadd", F32Avx512};
  if (f.avx2 && f.fma) return {"avx2 vfmadd", F32Avx2};
#endif
  return {"none", nullptr};
}

PeakLoop Bf16Loop() {
#if defined(__x86_64__)
  if (GetCpuFeatures().avx512bf16) return {"avx512bf16 vdpbf16ps", Bf16Avx512};
#endif
  return F32Loop();
}

PeakLoop AmxBf16Loop() {
#if defined(__x86_64__)
  if (kernels::cpu::IsaSupported(kernels::cpu::Isa::kAmx)) return {"amx-bf16 tdpbf16ps", Amx<false>};
#endif
  return Bf16Loop();
}

PeakLoop AmxInt8Loop() {
#if defined(__x86_64__)
  if (kernels::cpu::IsaSupported(kernels::cpu::Isa::kAmx) && GetCpuFeatures().amx_int8) {
    return {"amx-int8 tdpbssd", Amx<true>};
  }
#endif
  return Int8Loop();
}

// Operations per second, in G, of `loop` on every thread at once.
double RunPeak(const PeakLoop& loop, int64_t iters) {
  if (loop.run == nullptr) return 0;
  const int threads = DefaultThreadPool().num_threads();
  std::vector<double> ops(threads);
  const double seconds = Seconds([&] {
    ParallelFor(threads, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) ops[t] = loop.run(iters);
    });
  });
  double total = 0;
  for (double o : ops) total += o;
  return total / seconds / 1e9;
}

// A few ms per thread: short runs, best of many, since other processes can only slow a run down
// and a short run is more likely to be left alone by the scheduler.
constexpr int64_t kPeakIters = 1'000'000;

double BestOf(int runs, const std::function<double()>& fn) {
  double best = 0;
  for (int i = 0; i < runs; ++i) best = std::max(best, fn());
  return best;
}

void BM_ReadBandwidth(benchmark::State& state) {
  const double seconds = FastestIteration(state, [] { benchmark::DoNotOptimize(ReadPass()); });
  state.counters["GB/s"] = static_cast<double>(kStreamBytes) / seconds / 1e9;
}

void BM_Peak(benchmark::State& state, PeakLoop loop) {
  double best = 0;
  for (auto _ : state) best = std::max(best, RunPeak(loop, kPeakIters));
  state.counters["GOP/s"] = best;
  state.SetLabel(loop.isa);
}

}  // namespace

const MachineLimits& Limits() {
  static const MachineLimits limits = [] {
    MachineLimits m;
    ReadPass();  // fault the pages in before timing
    const double bytes = static_cast<double>(kStreamBytes);
    m.read_gbps = BestOf(10, [&] { return bytes / Seconds([] { ReadPass(); }) / 1e9; });
    m.int8_gops = BestOf(10, [] { return RunPeak(Int8Loop(), kPeakIters); });
    m.f32_gflops = BestOf(10, [] { return RunPeak(F32Loop(), kPeakIters); });
    m.bf16_gflops = BestOf(10, [] { return RunPeak(Bf16Loop(), kPeakIters); });
    m.int8_isa = Int8Loop().isa;
    m.f32_isa = F32Loop().isa;
    m.amx_bf16_gflops = BestOf(10, [] { return RunPeak(AmxBf16Loop(), kPeakIters); });
    m.bf16_isa = Bf16Loop().isa;
    m.amx_bf16_isa = AmxBf16Loop().isa;
    m.amx_int8_gops = BestOf(10, [] { return RunPeak(AmxInt8Loop(), kPeakIters); });
    m.amx_int8_isa = AmxInt8Loop().isa;
    return m;
  }();
  return limits;
}

void ReportRoofline(benchmark::State& state, double seconds, double bytes, double ops, double peak_gops) {
  const MachineLimits& m = Limits();
  const double roof = std::max(bytes / (m.read_gbps * 1e9), peak_gops > 0 ? ops / (peak_gops * 1e9) : 0.0);
  state.counters["GB/s"] = bytes / seconds / 1e9;
  state.counters["GOP/s"] = ops / seconds / 1e9;
  state.counters["roof%"] = 100.0 * roof / seconds;
}

void RegisterRooflineBenchmarks() {
  benchmark::RegisterBenchmark("Roofline/ReadBandwidth", BM_ReadBandwidth)->UseRealTime()->MinTime(0.2);
  benchmark::RegisterBenchmark("Roofline/Int8Peak", BM_Peak, Int8Loop())->UseRealTime()->MinTime(0.1);
  benchmark::RegisterBenchmark("Roofline/F32Peak", BM_Peak, F32Loop())->UseRealTime()->MinTime(0.1);
  benchmark::RegisterBenchmark("Roofline/Bf16Peak", BM_Peak, Bf16Loop())->UseRealTime()->MinTime(0.1);
  benchmark::RegisterBenchmark("Roofline/AmxBf16Peak", BM_Peak, AmxBf16Loop())->UseRealTime()->MinTime(0.1);
  benchmark::RegisterBenchmark("Roofline/AmxInt8Peak", BM_Peak, AmxInt8Loop())->UseRealTime()->MinTime(0.1);
}

}  // namespace moe::bench
