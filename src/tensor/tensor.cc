#include "tensor/tensor.h"

#include <cstdlib>
#include <cstring>

namespace moe {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

void Tensor::FreeDeleter::operator()(void* p) const { std::free(p); }

Tensor::Tensor(DType dtype, Shape shape) : Tensor(dtype, std::move(shape), /*zero=*/true) {}

Tensor::Tensor(DType dtype, Shape shape, bool zero) : dtype_(dtype), shape_(std::move(shape)) {
  for (int64_t d : shape_) MOE_CHECK(d >= 0, "negative dimension in %s", ShapeToString(shape_).c_str());
  constexpr size_t kAlign = 64;
  const size_t bytes = (std::max<size_t>(nbytes(), 1) + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, bytes);
  MOE_CHECK(p != nullptr, "out of memory allocating %zu bytes", bytes);
  if (zero) std::memset(p, 0, bytes);
  buffer_.reset(p);
}

void Tensor::Reshape(Shape shape) {
  MOE_CHECK(NumElements(shape) == numel(), "reshape %s -> %s changes the element count",
            ShapeToString(shape_).c_str(), ShapeToString(shape).c_str());
  shape_ = std::move(shape);
}

}  // namespace moe
