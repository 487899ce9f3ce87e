// Tensor: an owning, 64-byte-aligned, contiguous row-major buffer with a shape and a dtype.
// TensorView: the non-owning form kernels take.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "base/check.h"
#include "tensor/dtype.h"

namespace moe {

using Shape = std::vector<int64_t>;

int64_t NumElements(const Shape& shape);
std::string ShapeToString(const Shape& shape);

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;

  int64_t numel() const { return NumElements(shape); }
  int64_t dim(int i) const { return shape[i < 0 ? shape.size() + i : i]; }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape);  // zero-filled

  static Tensor F32(Shape shape) { return Tensor(DType::kF32, std::move(shape)); }
  // Bytes left as they come, for an output that is written whole before it is read: zero-filling
  // a 32-row lm_head's logits (16.5 MB on one thread) cost ~1 ms of a decode step.
  static Tensor ForOverwrite(DType dtype, Shape shape) { return Tensor(dtype, std::move(shape), /*zero=*/false); }

  bool empty() const { return buffer_ == nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int64_t numel() const { return NumElements(shape_); }
  size_t nbytes() const { return numel() * DTypeSize(dtype_); }

  void* raw() { return buffer_.get(); }
  const void* raw() const { return buffer_.get(); }
  template <typename T>
  T* data() { return static_cast<T*>(raw()); }
  template <typename T>
  const T* data() const { return static_cast<const T*>(raw()); }

  // The same bytes under a new shape with the same element count.
  void Reshape(Shape shape);

  TensorView view() { return TensorView{raw(), dtype_, shape_}; }
  TensorView view() const { return TensorView{const_cast<void*>(raw()), dtype_, shape_}; }

 private:
  Tensor(DType dtype, Shape shape, bool zero);

  struct FreeDeleter {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, FreeDeleter> buffer_;
  DType dtype_ = DType::kF32;
  Shape shape_;
};

}  // namespace moe
