// Checkpoint: the tensors of a Hugging Face checkpoint directory (model.safetensors, or shards
// listed in model.safetensors.index.json), memory-mapped, converted on request to the run dtype.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "tensor/tensor.h"

namespace moe {

class SafetensorsFile;

class Checkpoint {
 public:
  static Expected<Checkpoint> Open(const std::string& dir);

  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  ~Checkpoint();

  bool Has(const std::string& name) const;
  std::vector<std::string> TensorNames() const;

  // Reads tensor `name`, checks its shape is `shape`, and converts it to `dtype` (kF32 or kBF16).
  // F8_E4M3 weights are dequantized with their `<name>_scale_inv` 128x128 block scales.
  // Errors name the file, the tensor and what is wrong. Call from one thread at a time: conversion
  // runs on the default thread pool. For checkpoints over 1 GiB, logs progress every 10% of bytes.
  Expected<Tensor> Load(const std::string& name, const Shape& shape, DType dtype) const;

 private:
  Checkpoint();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moe
