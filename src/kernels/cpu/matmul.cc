// Matmul through oneDNN. One primitive per (k, n, weight dtype) with M left as a runtime
// dimension, so prefill and decode of any batch size share it.
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
    default: MOE_CHECK(false, "Matmul has no %s weights", std::string(DTypeName(dtype)).c_str());
  }
  return memory::data_type::undef;
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
    p.dst = memory::desc({DNNL_RUNTIME_DIM_VAL, n}, memory::data_type::f32, {n, 1});
    dnnl::matmul::desc desc(p.src, p.weights, p.dst);
    p.primitive = dnnl::matmul(dnnl::matmul::primitive_desc(desc, CpuEngine()));
  }
  return it->second;
}

}  // namespace

void Matmul(const float* x, int64_t m, const TensorView& w, float* y) {
  if (m == 0) return;
  const int64_t n = w.dim(0), k = w.dim(1);
  const MatmulPrimitive& p = GetPrimitive(k, n, w.dtype);

  std::vector<bf16> x_bf16;
  const void* src = x;
  if (w.dtype == DType::kBF16) {
    x_bf16.resize(m * k);
    ParallelFor(m * k, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) x_bf16[i] = F32ToBf16(x[i]);
    });
    src = x_bf16.data();
  }
  const memory::data_type dt = ToDnnl(w.dtype);
  memory src_mem(memory::desc({m, k}, dt, {k, 1}), CpuEngine(), const_cast<void*>(src));
  memory weights_mem(p.weights, CpuEngine(), w.data);
  memory dst_mem(memory::desc({m, n}, memory::data_type::f32, {n, 1}), CpuEngine(), y);
  dnnl::stream stream(CpuEngine());
  p.primitive.execute(stream, {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, weights_mem},
                               {DNNL_ARG_DST, dst_mem}});
  stream.wait();
}

}  // namespace moe::kernels
