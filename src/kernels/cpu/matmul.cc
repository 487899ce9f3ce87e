// Matmul through oneDNN. Plain weights: one primitive per (k, n, weight dtype) with M left as a
// runtime dimension, so prefill and decode of any batch size share it. Packed I8 weights (see
// PackMatmulWeight): one primitive per (k, n, rows bucket), since with a runtime M and a blocked
// weight oneDNN 2.6 falls back to its reference kernel (thousands of times slower); M is padded up
// to its bucket. The packed path runs 1.3-8x faster than the plain one at M = 1..512 on the bench
// model's expert shapes (AMX brgemm; bench/RESULTS.md), because the plain one repacks the weight
// on every call. I8 weights at up to cpu::Int8GemvMaxRowsFor rows skip oneDNN for Int8Gemv, which
// streams a weight laid out for it faster (int8_gemv.h); where AMX-INT8 runs the shape, Int8GemmAmx
// takes the rows above on the same layout, and on AVX2 Int8Gemv takes every batch; there oneDNN's
// layout is never built. oneDNN's INT8 runs only where it is exact (VNNI or AMX: OneDnnInt8Exact);
// without AVX2, portable loops over the plain rows take every I8 GEMM.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <limits>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "base/cpu_features.h"
#include "base/int_math.h"
#include "base/thread_pool.h"
#include "kernels/cpu/argmax_candidates.h"
#include "kernels/cpu/avx512.h"
#include "kernels/cpu/int8_gemv.h"
#include "kernels/cpu/int8_gemv_kernels.h"
#include "kernels/kernels.h"

namespace moe::kernels {
namespace {

using dnnl::memory;

// The most oneDNN may use: what GetCpuFeatures reports, so that a MOE_MAX_ISA cap holds for its
// kernels as for ours. Set before the first primitive, as oneDNN requires.
dnnl::cpu_isa MaxOneDnnIsa() {
  const CpuFeatures& f = GetCpuFeatures();
  if (f.amx_int8 && f.amx_bf16) return dnnl::cpu_isa::all;
  if (f.avx512f) return f.avx512bf16 ? dnnl::cpu_isa::avx512_core_bf16 : dnnl::cpu_isa::avx512_core_vnni;
  if (f.avx2) return f.avxvnni ? dnnl::cpu_isa::avx2_vnni : dnnl::cpu_isa::avx2;
  return dnnl::cpu_isa::sse41;
}

dnnl::engine& CpuEngine() {
  static dnnl::engine engine = [] {
    dnnl::set_max_cpu_isa(MaxOneDnnIsa());
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
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
  memory::desc src, weights, dst, scratchpad;
};

// A primitive that takes its scratchpad from the caller. oneDNN's own is one buffer that every
// thread's calls share, and the experts of a step run one per thread, each calling oneDNN.
MatmulPrimitive MakePrimitive(const memory::desc& src, const memory::desc& weights, const memory::desc& dst) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, weights, dst), attr, CpuEngine());
  return {dnnl::matmul(pd), src, weights, dst, pd.scratchpad_desc()};
}

// Runs p with this thread's scratchpad.
void Run(const MatmulPrimitive& p, const memory& src, const memory& weights, const memory& dst) {
  thread_local std::vector<uint8_t> scratch;
  scratch.resize(p.scratchpad.get_size());
  const memory scratch_mem(p.scratchpad, CpuEngine(), scratch.data());
  dnnl::stream stream(CpuEngine());
  p.primitive.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst},
                               {DNNL_ARG_SCRATCHPAD, scratch_mem}});
  stream.wait();
}

const MatmulPrimitive& GetPrimitive(int64_t k, int64_t n, DType dtype) {
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t, DType>, MatmulPrimitive> cache;
  std::lock_guard lock(mutex);
  auto [it, inserted] = cache.try_emplace({k, n, dtype});
  if (inserted) {
    const memory::data_type dt = ToDnnl(dtype);
    it->second = MakePrimitive(memory::desc({DNNL_RUNTIME_DIM_VAL, k}, dt, {k, 1}),
                               memory::desc({k, n}, dt, {1, k}),  // the [n, k] row-major weight, seen as k x n
                               memory::desc({DNNL_RUNTIME_DIM_VAL, n}, DstType(dtype), {n, 1}));
  }
  return it->second;
}

// The blocked layout the M = 1 primitive chooses: primitives for other M accept it too.
const memory::desc& PackedWeightsDesc(int64_t k, int64_t n) {
  static std::mutex mutex;
  static std::map<std::pair<int64_t, int64_t>, memory::desc> cache;
  std::lock_guard lock(mutex);
  auto [it, inserted] = cache.try_emplace({k, n});
  if (inserted) {
    const memory::desc src({1, k}, memory::data_type::s8, {k, 1});
    const memory::desc weights({k, n}, memory::data_type::s8, memory::format_tag::any);
    const memory::desc dst({1, n}, memory::data_type::s32, {n, 1});
    it->second = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), CpuEngine()).weights_desc();
  }
  return it->second;
}

// Rows rounded up so that a bounded number of primitives per shape serve every batch. Up to 1024
// rows by 16: a prefill's experts get a few hundred rows each, and padding them by up to 63 (as
// a step of 64 did) cost ~12% of their GEMM work for nothing; each bucket's primitive is made once.
int64_t RowBucket(int64_t m) {
  if (m <= 16) return m;
  if (m <= 1024) return (m + 15) / 16 * 16;
  return (m + 255) / 256 * 256;
}

const MatmulPrimitive& GetPackedPrimitive(int64_t k, int64_t n, int64_t rows) {
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t, int64_t>, MatmulPrimitive> cache;
  const memory::desc& weights = PackedWeightsDesc(k, n);
  std::lock_guard lock(mutex);
  auto [it, inserted] = cache.try_emplace({k, n, rows});
  if (inserted) {
    it->second = MakePrimitive(memory::desc({rows, k}, memory::data_type::s8, {k, 1}), weights,
                               memory::desc({rows, n}, memory::data_type::s32, {n, 1}));
  }
  return it->second;
}

// Whether the weight laid out for Int8Gemv serves an [n, k] I8 weight at every batch size: Int8Gemv
// for a few rows and Int8GemmAmx above, or Int8Gemv for all.
bool GemvLayoutServesEveryBatch(int64_t n, int64_t k) {
  return cpu::Int8GemvSupported() && (cpu::Int8GemmAmxSupported(k, n) ||
                                      cpu::Int8GemvMaxRowsFor(n, k) == std::numeric_limits<int64_t>::max());
}

// Whether oneDNN's INT8 GEMM is exact here: its kernels without VNNI (or AMX) sum pairs of byte
// products in saturating 16 bits (VPMADDUBSW), which full-range weights overflow.
bool OneDnnInt8Exact() {
  const CpuFeatures& f = GetCpuFeatures();
  return f.avx512vnni || f.avxvnni || f.amx_int8;
}

// INT32 products of I8 rows and a plain I8 weight in portable loops, exact: for CPUs where neither
// Int8Gemv nor an exact oneDNN INT8 GEMM runs (no AVX2).
void PortableInt8Products(const int8_t* x, int64_t m, const int8_t* w, int64_t n, int64_t k, int32_t* y) {
  ParallelFor(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = begin; j < end; ++j) {
        int32_t sum = 0;
        for (int64_t p = 0; p < k; ++p) sum += int32_t{x[i * k + p]} * int32_t{w[j * k + p]};
        y[i * n + j] = sum;
      }
    }
  });
}

}  // namespace

const int32_t* cpu::Int8GemmOneDnn(const int8_t* src, int64_t m, int64_t k, int64_t n, const void* packed,
                                   int32_t* y) {
  const int64_t rows = RowBucket(m);
  thread_local std::vector<int8_t> padded_src;
  thread_local std::vector<int32_t> padded_dst;
  void* a = const_cast<int8_t*>(src);
  int32_t* c = y;
  if (rows != m) {
    padded_src.resize(rows * k);
    std::memcpy(padded_src.data(), src, m * k);
    std::fill(padded_src.begin() + m * k, padded_src.end(), int8_t{0});
    padded_dst.resize(rows * n);
    a = padded_src.data();
    c = padded_dst.data();
  }
  const MatmulPrimitive& p = GetPackedPrimitive(k, n, rows);
  Run(p, memory(p.src, CpuEngine(), a), memory(p.weights, CpuEngine(), const_cast<void*>(packed)),
      memory(p.dst, CpuEngine(), c));
  return c;
}

namespace {

// row[j] = float(products[j]) * src_scale * col_scales[j], in that order (Int8GemvScaled's bits):
// an I8 GEMM's epilogue, in place when products is row's storage.
void ScaleProducts(const int32_t* products, float src_scale, const float* col_scales, int64_t n, float* row) {
  for (int64_t j = 0; j < n; ++j) row[j] = static_cast<float>(products[j]) * src_scale * col_scales[j];
}

#if defined(__x86_64__)
// The same operations on each value, so the same bits; 16 at a time rather than SSE's 4.
MOE_AVX512 void ScaleProductsAvx512(const int32_t* products, float src_scale, const float* col_scales, int64_t n,
                                    float* row) {
  const __m512 scale = _mm512_set1_ps(src_scale);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 values = _mm512_cvtepi32_ps(_mm512_loadu_si512(products + j));
    _mm512_storeu_ps(row + j, _mm512_mul_ps(_mm512_mul_ps(values, scale), _mm512_loadu_ps(col_scales + j)));
  }
  ScaleProducts(products + j, src_scale, col_scales + j, n - j, row + j);
}
#endif

// Products in the weights' type (I8: into y's storage as INT32) through the runtime-M primitive.
void ExecutePlain(const void* src, int64_t m, const TensorView& w, float* y) {
  MOE_CHECK(w.data != nullptr, "Matmul: an I8 weight held only packed came without its packed layout");
  const int64_t n = w.dim(0), k = w.dim(1);
  const MatmulPrimitive& p = GetPrimitive(k, n, w.dtype);
  const memory::data_type dt = ToDnnl(w.dtype);
  Run(p, memory(memory::desc({m, k}, dt, {k, 1}), CpuEngine(), const_cast<void*>(src)),
      memory(p.weights, CpuEngine(), w.data), memory(memory::desc({m, n}, DstType(w.dtype), {n, 1}), CpuEngine(), y));
}

// y = src · w^T for activations already in the weights' type (I8: with per-row scales).
void Execute(const void* src, const float* src_scales, int64_t m, const Weight& weight, float* y) {
  const TensorView& w = weight.data;
  const int64_t n = w.dim(0), k = w.dim(1);
  // INT32 results go to y's own storage (or, from a padded GEMM, to a buffer of this thread), then
  // are scaled into y; Int8Gemv and Int8GemmAmx scale their own, a block at a time.
  static_assert(sizeof(int32_t) == sizeof(float));
  const int32_t* products = reinterpret_cast<const int32_t*>(y);
  if (weight.gemv_packed) {
    const auto* gemv_packed = static_cast<const uint8_t*>(weight.gemv_packed);
    if (m <= cpu::Int8GemvMaxRowsFor(n, k)) {
      cpu::Int8GemvScaled(static_cast<const int8_t*>(src), src_scales, m, gemv_packed, n, k, weight.row_scales, y);
      return;
    }
    if (cpu::Int8GemmAmxSupported(k, n)) {
      cpu::Int8GemmAmxScaled(static_cast<const int8_t*>(src), src_scales, m, k, n, gemv_packed, weight.row_scales, y);
      return;
    }
  }
  if (w.dtype == DType::kI8 && !OneDnnInt8Exact()) {
    MOE_CHECK(w.data != nullptr, "Matmul: this CPU needs an I8 weight's plain rows (NeedsPlainI8)");
    PortableInt8Products(static_cast<const int8_t*>(src), m, w.as<int8_t>(), n, k, reinterpret_cast<int32_t*>(y));
  } else if (weight.packed) {
    MOE_CHECK(w.dtype == DType::kI8, "only I8 weights are packed");
    products = cpu::Int8GemmOneDnn(static_cast<const int8_t*>(src), m, k, n, weight.packed,
                                   reinterpret_cast<int32_t*>(y));
  } else {
    ExecutePlain(src, m, w, y);
  }

  if (w.dtype == DType::kI8) {
#if defined(__x86_64__)
    static const auto scale_products = GetCpuFeatures().avx512f ? ScaleProductsAvx512 : ScaleProducts;
#else
    static const auto scale_products = ScaleProducts;
#endif
    ParallelFor(m, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        scale_products(products + i * n, src_scales[i], weight.row_scales, n, y + i * n);
      }
    });
  }
}

// Activation rows in two INT8 parts: rows [0, m) of `parts` the rows quantized, rows [m, 2m) what
// that left, quantized again; scales likewise.
void SplitTwoParts(const float* x, int64_t m, int64_t k, int8_t* parts, float* scales) {
  QuantizeRows(x, m, k, parts, scales);
  const auto residual = std::make_unique_for_overwrite<float[]>(m * k);
  ParallelFor(m, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * k; i < end * k; ++i) residual[i] = x[i] - static_cast<float>(parts[i]) * scales[i / k];
  });
  QuantizeRows(residual.get(), m, k, parts + m * k, scales + m);
}

}  // namespace

bool NeedsMatmulPacking(int64_t n, int64_t k) { return OneDnnInt8Exact() && !GemvLayoutServesEveryBatch(n, k); }

bool NeedsPlainI8(int64_t n, int64_t k) { return !OneDnnInt8Exact() && !GemvLayoutServesEveryBatch(n, k); }

Tensor PackMatmulWeight(const TensorView& w) {
  MOE_CHECK(w.dtype == DType::kI8 && w.shape.size() == 2, "PackMatmulWeight takes a 2-D I8 weight");
  const int64_t n = w.dim(0), k = w.dim(1);
  const memory::desc& packed_desc = PackedWeightsDesc(k, n);
  Tensor packed(DType::kI8, {static_cast<int64_t>(packed_desc.get_size())});
  memory plain(memory::desc({k, n}, memory::data_type::s8, {1, k}), CpuEngine(), const_cast<void*>(w.data));
  memory blocked(packed_desc, CpuEngine(), packed.data<int8_t>());
  dnnl::stream stream(CpuEngine());
  dnnl::reorder(plain, blocked).execute(stream, plain, blocked);
  stream.wait();
  return packed;
}

Tensor PackGemvWeight(const TensorView& w) {
  MOE_CHECK(w.dtype == DType::kI8 && w.shape.size() == 2, "PackGemvWeight takes a 2-D I8 weight");
  if (!cpu::Int8GemvSupported()) return {};
  const int64_t n = w.dim(0), k = w.dim(1);
  Tensor packed(DType::kI8, {cpu::Int8GemvPackedBytes(n, k)});
  cpu::PackInt8Gemv(w.as<int8_t>(), n, k, reinterpret_cast<uint8_t*>(packed.data<int8_t>()));
  return packed;
}

void Matmul(const float* x, int64_t m, const Weight& weight, float* y) {
  if (m == 0) return;
  const TensorView& w = weight.data;
  const int64_t k = w.dim(1);
  // oneDNN 2.6 has no BF16 matmul below AVX-512 (it fails to create the primitive).
  const bool onednn_bf16 = GetCpuFeatures().avx512f && GetCpuFeatures().avx512bw;
  if (w.dtype == DType::kBF16 && !onednn_bf16) return BatchInvariantMatmul(x, m, weight, y);
  if (w.dtype == DType::kBF16) {
    std::vector<bf16> x_bf16(m * k);
    ParallelFor(m * k, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) x_bf16[i] = F32ToBf16(x[i]);
    });
    Execute(x_bf16.data(), nullptr, m, weight, y);
  } else if (w.dtype == DType::kI8) {
    const auto x_int8 = std::make_unique_for_overwrite<int8_t[]>(m * k);
    const auto x_scales = std::make_unique_for_overwrite<float[]>(m);
    QuantizeRows(x, m, k, x_int8.get(), x_scales.get());
    Execute(x_int8.get(), x_scales.get(), m, weight, y);
  } else {
    Execute(x, nullptr, m, weight, y);
  }
}

namespace {

int32_t FirstMax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

}  // namespace

Tensor I8RowNorms(const TensorView& w, const float* row_scales) {
  MOE_CHECK(w.dtype == DType::kI8 && w.shape.size() == 2, "I8RowNorms takes a 2-D I8 weight");
  const int64_t n = w.dim(0), k = w.dim(1);
  const int8_t* q = w.as<int8_t>();
  Tensor norms = Tensor::F32({n});
  const cpu::Isa isa = cpu::BestArgmaxIsa();
  for (int64_t j = 0; j < n; ++j) {
    const int32_t squares = cpu::DotInt8(isa, q + j * k, q + j * k, k);
    // Rounded up, well past the few ulps the double arithmetic may be short by.
    norms.data<float>()[j] = static_cast<float>(std::sqrt(static_cast<double>(squares)) * row_scales[j] * (1 + 0x1p-20));
  }
  return norms;
}

void MatmulTwoPart(const float* x, int64_t m, const Weight& weight, float* y, const std::vector<bool>& argmax_only,
                   const float* row_norms, int32_t* first_max) {
  MOE_CHECK(weight.data.dtype == DType::kI8, "MatmulTwoPart needs I8 weights");
  MOE_CHECK(argmax_only.empty() || (static_cast<int64_t>(argmax_only.size()) == m && row_norms),
            "MatmulTwoPart: argmax flags need one per row and the row norms");
  if (m == 0) return;
  const int64_t n = weight.data.dim(0), k = weight.data.dim(1);
  const auto parts = std::make_unique_for_overwrite<int8_t[]>(2 * m * k);
  const auto scales = std::make_unique_for_overwrite<float[]>(2 * m);
  SplitTwoParts(x, m, k, parts.get(), scales.get());
  // One GEMM over every row's first part, then the second parts of the rows that need every column.
  const auto* plain = static_cast<const int8_t*>(weight.data.data);
  const bool shortcut = !argmax_only.empty() && plain != nullptr;
  std::vector<int64_t> second_row(m, -1);  // a row's second part's row in the GEMM
  int64_t gemm_rows = m;
  for (int64_t i = 0; i < m; ++i) {
    if (!shortcut || !argmax_only[i]) second_row[i] = gemm_rows++;
  }
  const auto input = std::make_unique_for_overwrite<int8_t[]>(gemm_rows * k);
  const auto input_scales = std::make_unique_for_overwrite<float[]>(gemm_rows);
  std::memcpy(input.get(), parts.get(), m * k);
  std::copy(scales.get(), scales.get() + m, input_scales.get());
  for (int64_t i = 0; i < m; ++i) {
    if (second_row[i] < 0) continue;
    std::memcpy(input.get() + second_row[i] * k, parts.get() + (m + i) * k, k);
    input_scales[second_row[i]] = scales[m + i];
  }
  // With every row flagged, the GEMM's rows are y's.
  const auto buffer = std::make_unique_for_overwrite<float[]>(gemm_rows > m ? gemm_rows * n : 0);
  float* products = gemm_rows > m ? buffer.get() : y;
  Execute(input.get(), input_scales.get(), gemm_rows, weight, products);
  const cpu::Isa isa = cpu::BestArgmaxIsa();
  // A flagged row's maximum survives. Column j's second part, computed as for an unflagged row, is
  // at most b_j = bound * row_norms[j] in magnitude (Cauchy-Schwarz, the 2^-10 covering every
  // rounding on the way), so its sum with the first part f_j lies, rounding being monotonic,
  // within [fl(f_j - b_j), fl(f_j + b_j)]. A column whose upper end is below the largest lower end
  // is below the column that has that end, and cannot be the maximum: the others get their second
  // part, the rest keep f_j, which is below the maximum too.
  ParallelFor(m, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> candidates;
    for (int64_t i = begin; i < end; ++i) {
      const float* first = products + i * n;
      float* row = y + i * n;
      if (second_row[i] >= 0) {
        const float* rest = products + second_row[i] * n;
        for (int64_t j = 0; j < n; ++j) row[j] = first[j] + rest[j];
        if (first_max) first_max[i] = argmax_only.empty() || !argmax_only[i] ? -1 : FirstMax(row, n);
        continue;
      }
      const int8_t* low = parts.get() + (m + i) * k;
      const float low_scale = scales[m + i];
      const double low_norm = std::sqrt(static_cast<double>(cpu::DotInt8(isa, low, low, k)));
      const auto bound = static_cast<float>(low_norm * low_scale * (1 + 0x1p-10));
      cpu::MaxCandidates(isa, first, row_norms, n, bound, candidates);
      if (row != first) std::copy(first, first + n, row);
      for (const int32_t j : candidates) {
        row[j] += static_cast<float>(cpu::DotInt8(isa, low, plain + j * k, k)) * low_scale * weight.row_scales[j];
      }
      // Every other column is below the threshold, which a candidate reaches.
      if (first_max) {
        int32_t best = candidates.empty() ? FirstMax(row, n) : candidates.front();  // empty: NaNs
        for (const int32_t j : candidates) best = row[j] > row[best] ? j : best;
        first_max[i] = best;
      }
    }
  });
}

void MatmulQuantized(const int8_t* x, const float* x_scales, int64_t m, const Weight& weight, float* y) {
  MOE_CHECK(weight.data.dtype == DType::kI8, "MatmulQuantized needs I8 weights");
  if (m == 0) return;
  Execute(x, x_scales, m, weight, y);
}

bool MatmulRunsByBlocks(int64_t m, const Weight& w) {
  return w.data.dtype == DType::kI8 && w.gemv_packed && m <= cpu::Int8GemvMaxRowsFor(w.data.dim(0), w.data.dim(1));
}

void MatmulQuantizedBlocks(const int8_t* x, const float* x_scales, int64_t m, const Weight& w, int64_t block_begin,
                           int64_t block_end, float* y) {
  static_assert(kMatmulColumnBlock == cpu::kGemvBlockCols);
  MOE_CHECK(MatmulRunsByBlocks(m, w), "MatmulQuantizedBlocks: not a weight Int8Gemv runs at %lld rows",
            static_cast<long long>(m));
  if (m == 0) return;
  cpu::Int8GemvScaledBlocks(x, x_scales, m, static_cast<const uint8_t*>(w.gemv_packed), w.data.dim(0),
                            w.data.dim(1), w.row_scales, block_begin, block_end, y);
}

}  // namespace moe::kernels
