// kernels::Matmul on the linear layers of DeepSeek-V3 and of the bench model (bench-3b), for
// decode-sized (M = 1, 8) and prefill-sized (M = 64, 512) batches, in each run dtype.
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "bench.h"
#include "cold.h"
#include "kernels/cpu/int8_gemv.h"
#include "kernels/kernels.h"
#include "roofline.h"
#include "tensor/tensor.h"

namespace moe::bench {
namespace {

struct GemmShape {
  const char* name;
  int64_t k, n;  // y[m, n] = x[m, k] w[n, k]^T
};

// Cheap deterministic values in [-1, 1): the lm_head alone has 265M weights.
float Noise(uint64_t i) {
  i = (i + 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
  i ^= i >> 31;
  return static_cast<float>(static_cast<int64_t>(i >> 40) - (int64_t{1} << 23)) / static_cast<float>(int64_t{1} << 23);
}

// One weight, in as many copies as ColdCopies asks, kept between the runs of consecutive
// benchmarks, which share it.
struct CachedWeight {
  std::tuple<int64_t, int64_t, DType> key{};
  std::vector<Tensor> data;
  Tensor scales;
  std::vector<kernels::Weight> views;
};

const std::vector<kernels::Weight>& WeightCopies(const GemmShape& s, DType dtype) {
  static CachedWeight cached;
  if (cached.key == std::make_tuple(s.k, s.n, dtype) && !cached.views.empty()) return cached.views;
  cached = CachedWeight();  // free the previous weight first
  Tensor first(dtype, {s.n, s.k});
  const int64_t count = s.n * s.k;
  for (int64_t i = 0; i < count; ++i) {
    const float v = Noise(i);
    switch (dtype) {
      case DType::kF32: first.data<float>()[i] = v * 0.05f; break;
      case DType::kBF16: first.data<bf16>()[i] = F32ToBf16(v * 0.05f); break;
      default: first.data<int8_t>()[i] = static_cast<int8_t>(v * 127.0f); break;
    }
  }
  cached.scales = Tensor::F32({s.n});
  for (int64_t i = 0; i < s.n; ++i) cached.scales.data<float>()[i] = 0.05f / 127.0f;
  const int64_t copies = ColdCopies(static_cast<int64_t>(first.nbytes()));
  for (int64_t c = 1; c < copies; ++c) {
    Tensor copy(dtype, {s.n, s.k});
    std::memcpy(copy.raw(), first.raw(), first.nbytes());
    cached.data.push_back(std::move(copy));
  }
  cached.data.push_back(std::move(first));
  for (const Tensor& t : cached.data) {
    cached.views.emplace_back(t.view(), dtype == DType::kI8 ? cached.scales.data<float>() : nullptr);
  }
  cached.key = {s.k, s.n, dtype};
  return cached.views;
}

void BM_Matmul(benchmark::State& state, GemmShape shape, DType dtype) {
  const int64_t m = state.range(0);
  const std::vector<kernels::Weight>& weights = WeightCopies(shape, dtype);
  std::vector<float> x(m * shape.k), y(m * shape.n);
  for (int64_t i = 0; i < m * shape.k; ++i) x[i] = Noise(i + 12345);
  size_t next = 0;
  const double seconds = FastestIteration(state, [&] {
    kernels::Matmul(x.data(), m, weights[next], y.data());
    next = (next + 1) % weights.size();
    benchmark::DoNotOptimize(y.data());
  });
  // The weights are read once per call; activations in, results out (both F32 at the interface).
  const double bytes = static_cast<double>(shape.n * shape.k * DTypeSize(dtype)) + 4.0 * m * (shape.k + shape.n);
  const double ops = 2.0 * m * shape.n * shape.k;
  const MachineLimits& limits = Limits();
  const double peak = dtype == DType::kI8 ? limits.int8_gops : dtype == DType::kBF16 ? limits.bf16_gflops : limits.f32_gflops;
  ReportRoofline(state, seconds, bytes, ops, peak);
}

// The I8 weight of WeightCopies as `pack` lays it out (PackMatmulWeight or PackGemvWeight), as many
// copies, kept the same way.
const std::vector<Tensor>& PackedCopies(const GemmShape& s, Tensor (*pack)(const TensorView&)) {
  static std::tuple<int64_t, int64_t, Tensor (*)(const TensorView&)> key;
  static std::vector<Tensor> copies;
  if (key == std::make_tuple(s.k, s.n, pack) && !copies.empty()) return copies;
  copies.clear();
  const std::vector<kernels::Weight>& plain = WeightCopies(s, DType::kI8);
  const Tensor first = pack(plain.front().data);
  for (size_t c = 0; c < plain.size(); ++c) {
    Tensor copy(DType::kI8, first.shape());
    std::memcpy(copy.raw(), first.raw(), first.nbytes());
    copies.push_back(std::move(copy));
  }
  key = {s.k, s.n, pack};
  return copies;
}

// The INT32 products alone of the kernels Matmul chooses between for I8 weights: Int8Gemv at a
// few rows, oneDNN or (on AMX-INT8 machines) Int8GemmAmx at more; oneDNN on its own layout, the
// others on Int8Gemv's.
enum class Int8Kernel { kGemv, kOneDnn, kAmx };

void BM_Int8Products(benchmark::State& state, GemmShape shape, Int8Kernel kernel) {
  if (kernel == Int8Kernel::kGemv && !kernels::cpu::Int8GemvSupported()) {
    state.SkipWithError("this CPU lacks AVX-512 VNNI");
    return;
  }
  const int64_t m = state.range(0);
  const std::vector<Tensor>& packed =
      PackedCopies(shape, kernel == Int8Kernel::kOneDnn ? &kernels::PackMatmulWeight : &kernels::PackGemvWeight);
  std::vector<int8_t> x(m * shape.k);
  for (int64_t i = 0; i < m * shape.k; ++i) x[i] = static_cast<int8_t>(Noise(i + 12345) * 127.0f);
  std::vector<int32_t> y(m * shape.n);
  size_t next = 0;
  const double seconds = FastestIteration(state, [&] {
    const int8_t* w = packed[next].data<int8_t>();
    const auto* unsigned_w = reinterpret_cast<const uint8_t*>(w);
    switch (kernel) {
      case Int8Kernel::kGemv: kernels::cpu::Int8Gemv(x.data(), m, unsigned_w, shape.n, shape.k, y.data()); break;
      case Int8Kernel::kOneDnn: kernels::cpu::Int8GemmOneDnn(x.data(), m, shape.k, shape.n, w, y.data()); break;
      case Int8Kernel::kAmx: kernels::cpu::Int8GemmAmx(x.data(), m, shape.k, shape.n, unsigned_w, y.data()); break;
    }
    next = (next + 1) % packed.size();
    benchmark::DoNotOptimize(y.data());
  });
  const double bytes = static_cast<double>(shape.n * shape.k) + m * (shape.k + 4.0 * shape.n);
  // Int8Gemv runs VPDPBUSD; oneDNN and Int8GemmAmx run tiles where the CPU has AMX-INT8.
  ReportRoofline(state, seconds, bytes, 2.0 * m * shape.n * shape.k,
                 kernel == Int8Kernel::kGemv ? Limits().int8_gops : Limits().amx_int8_gops);
}

// The lm_head of an I8 run (kernels::MatmulTwoPart): every logit of each row, or, for greedy rows,
// what the row's maximum needs, and that maximum's column.
void BM_LmHead(benchmark::State& state, GemmShape shape, bool argmax) {
  const int64_t m = state.range(0);
  const kernels::Weight& plain = WeightCopies(shape, DType::kI8).front();
  const Tensor packed = kernels::PackMatmulWeight(plain.data), gemv_packed = kernels::PackGemvWeight(plain.data);
  const Tensor norms = kernels::I8RowNorms(plain.data, plain.row_scales);
  const kernels::Weight weight(plain.data, plain.row_scales, packed.data<int8_t>(),
                               gemv_packed.empty() ? nullptr : gemv_packed.data<int8_t>());
  std::vector<float> x(m * shape.k), y(m * shape.n);
  for (int64_t i = 0; i < m * shape.k; ++i) x[i] = Noise(i + 12345);
  const std::vector<bool> flags(argmax ? m : 0, true);
  std::vector<int32_t> first_max(m);
  kernels::MatmulTwoPart(x.data(), m, weight, y.data(), flags, norms.data<float>());  // builds oneDNN's primitive
  const double seconds = FastestIteration(state, [&] {
    kernels::MatmulTwoPart(x.data(), m, weight, y.data(), flags, norms.data<float>(), first_max.data());
    benchmark::DoNotOptimize(y.data());
  });
  const double rows = argmax ? m : 2.0 * m;  // of the GEMM
  ReportRoofline(state, seconds, static_cast<double>(shape.n * shape.k), 2.0 * rows * shape.n * shape.k,
                 Limits().int8_gops);
}

}  // namespace

void RegisterMatmulBenchmarks() {
  const GemmShape shapes[] = {
      // bench-3b: hidden 2048, dense intermediate 8192, expert 1024, q_lora 1536, 16 heads.
      {"bench_dense_up", 2048, 8192},
      {"bench_expert_up", 2048, 1024},
      {"bench_expert_down", 1024, 2048},
      {"bench_q_b", 1536, 16 * 192},
      {"bench_kv_a", 2048, 512 + 64},
      // DeepSeek-V3: hidden 7168, expert 2048, 128 heads.
      {"v3_expert_up", 7168, 2048},
      {"v3_q_b", 1536, 128 * 192},
      {"v3_kv_a", 7168, 512 + 64},
  };
  const std::pair<DType, const char*> dtypes[] = {{DType::kF32, "f32"}, {DType::kBF16, "bf16"}, {DType::kI8, "i8"}};
  for (const GemmShape& s : shapes) {
    for (const auto& [dtype, dtype_name] : dtypes) {
      const std::string name = std::string("Matmul/") + s.name + "/" + dtype_name;
      benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, s, dtype)
          ->ArgName("M")->Arg(1)->Arg(8)->Arg(64)->Arg(512)->UseRealTime()->MinTime(0.05);
    }
  }
  // lm_head: decode only, and not in F32 (1 GiB of weights).
  const GemmShape lm_head{"bench_lm_head", 2048, 129280};
  for (const auto& [dtype, dtype_name] : {dtypes[1], dtypes[2]}) {
    const std::string name = std::string("Matmul/") + lm_head.name + "/" + dtype_name;
    benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, lm_head, dtype)
        ->ArgName("M")->Arg(1)->Arg(8)->UseRealTime()->MinTime(0.05);
  }
  for (const auto& [argmax, name] : {std::pair(false, "LmHead/two_part"), std::pair(true, "LmHead/argmax")}) {
    benchmark::RegisterBenchmark(name, BM_LmHead, lm_head, argmax)
        ->ArgName("M")->Arg(1)->Arg(8)->Arg(16)->Arg(32)->UseRealTime()->MinTime(0.05);
  }
  // Where Int8Gemv stops beating oneDNN or Int8GemmAmx (kInt8GemvMaxRows and the like), on
  // bench-3b's expert, attention and lm_head shapes.
  const GemmShape small_batch_shapes[] = {shapes[1], shapes[2], {"bench_q_a", 2048, 1536}, shapes[3], lm_head};
  for (const GemmShape& s : small_batch_shapes) {
    for (const auto& [kernel, name] : {std::pair(Int8Kernel::kGemv, "int8_gemv"),
                                       std::pair(Int8Kernel::kOneDnn, "onednn_packed"), std::pair(Int8Kernel::kAmx, "amx")}) {
      if (kernel == Int8Kernel::kAmx && !kernels::cpu::Int8GemmAmxSupported(s.k, s.n)) continue;
      benchmark::RegisterBenchmark((std::string("Int8Products/") + s.name + "/" + name).c_str(), BM_Int8Products, s,
                                   kernel)
          ->ArgName("M")->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(12)->Arg(16)->Arg(24)->Arg(32)->UseRealTime()
          ->MinTime(0.05);
    }
  }
  // Prefill-sized batches: oneDNN against Int8GemmAmx, where the machine has AMX-INT8.
  for (const GemmShape& s : {shapes[1], shapes[2], shapes[3]}) {
    for (const auto& [kernel, name] : {std::pair(Int8Kernel::kOneDnn, "onednn_packed"),
                                       std::pair(Int8Kernel::kAmx, "amx")}) {
      if (kernel == Int8Kernel::kAmx && !kernels::cpu::Int8GemmAmxSupported(s.k, s.n)) continue;
      benchmark::RegisterBenchmark((std::string("Int8Products/") + s.name + "/" + name).c_str(), BM_Int8Products, s,
                                   kernel)
          ->ArgName("M")->Arg(64)->Arg(256)->Arg(2048)->UseRealTime()->MinTime(0.05);
    }
  }
}

}  // namespace moe::bench
