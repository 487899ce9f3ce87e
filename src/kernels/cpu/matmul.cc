// Matmul through oneDNN. One primitive per (k, n, weight dtype) with M left as a runtime
// dimension, so prefill and decode of any batch size share it.
#include <bit>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "base/thread_pool.h"
#include "kernels/kernels.h"

namespace moe::kernels {
namespace {

using dnnl::memory;

dnnl::engine& CpuEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

memory::data_type ToDnnl(DType dtype) {
  switch (dtype) {
    case DType::kF32: return memory::data_type::f32;
    case DType::kBF16: return memory::data_type::bf16;
    case DType::kI8: return memory::data_type::s8;
    default: MOE_CHECK(false, "Matmul has no %s weights", std::string(DTypeName(dtype)).c_str());
  }
  return memory::data_type::undef;
}

// INT8 products accumulate exactly in INT32; the FP32 scaling is ours, so that the result does not
// depend on how oneDNN orders it.
memory::data_type DstType(DType weight_dtype) {
  return weight_dtype == DType::kI8 ? memory::data_type::s32 : memory::data_type::f32;
}

struct MatmulPrimitive {
  dnnl::matmul primitive;
  memory::desc src, weights, dst;
};

const MatmulPrimitive& GetPrimitive(int64_t k, int64_t n, DType dtype) {
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t, DType>, MatmulPrimitive> cache;
  std::lock_guard lock(mutex);
  auto [it, inserted] = cache.try_emplace({k, n, dtype});
  if (inserted) {
    const memory::data_type dt = ToDnnl(dtype);
    MatmulPrimitive& p = it->second;
    p.src = memory::desc({DNNL_RUNTIME_DIM_VAL, k}, dt, {k, 1});
    p.weights = memory::desc({k, n}, dt, {1, k});  // the [n, k] row-major weight, seen as k x n
    p.dst = memory::desc({DNNL_RUNTIME_DIM_VAL, n}, DstType(dtype), {n, 1});
    dnnl::matmul::desc desc(p.src, p.weights, p.dst);
    p.primitive = dnnl::matmul(dnnl::matmul::primitive_desc(desc, CpuEngine()));
  }
  return it->second;
}

}  // namespace

namespace {

// y = src · w^T for activations already in the weights' type (I8: with per-row scales).
void Execute(const void* src, const float* src_scales, int64_t m, const Weight& weight, float* y) {
  const TensorView& w = weight.data;
  const int64_t n = w.dim(0), k = w.dim(1);
  const MatmulPrimitive& p = GetPrimitive(k, n, w.dtype);
  // INT32 results go to y's own storage, then are scaled in place.
  static_assert(sizeof(int32_t) == sizeof(float));
  const memory::data_type dt = ToDnnl(w.dtype);
  memory src_mem(memory::desc({m, k}, dt, {k, 1}), CpuEngine(), const_cast<void*>(src));
  memory weights_mem(p.weights, CpuEngine(), w.data);
  memory dst_mem(memory::desc({m, n}, DstType(w.dtype), {n, 1}), CpuEngine(), y);
  dnnl::stream stream(CpuEngine());
  p.primitive.execute(stream, {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, weights_mem},
                               {DNNL_ARG_DST, dst_mem}});
  stream.wait();

  if (w.dtype == DType::kI8) {
    ParallelFor(m, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float* row = y + i * n;
        for (int64_t j = 0; j < n; ++j) {
          row[j] = static_cast<float>(std::bit_cast<int32_t>(row[j])) * src_scales[i] * weight.row_scales[j];
        }
      }
    });
  }
}

}  // namespace

void Matmul(const float* x, int64_t m, const Weight& weight, float* y) {
  if (m == 0) return;
  const TensorView& w = weight.data;
  const int64_t k = w.dim(1);
  if (w.dtype == DType::kBF16) {
    std::vector<bf16> x_bf16(m * k);
    ParallelFor(m * k, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) x_bf16[i] = F32ToBf16(x[i]);
    });
    Execute(x_bf16.data(), nullptr, m, weight, y);
  } else if (w.dtype == DType::kI8) {
    std::vector<int8_t> x_int8(m * k);
    std::vector<float> x_scales(m);
    QuantizeRows(x, m, k, x_int8.data(), x_scales.data());
    Execute(x_int8.data(), x_scales.data(), m, weight, y);
  } else {
    Execute(x, nullptr, m, weight, y);
  }
}

void MatmulQuantized(const int8_t* x, const float* x_scales, int64_t m, const Weight& weight, float* y) {
  MOE_CHECK(weight.data.dtype == DType::kI8, "MatmulQuantized needs I8 weights");
  if (m == 0) return;
  Execute(x, x_scales, m, weight, y);
}

}  // namespace moe::kernels
