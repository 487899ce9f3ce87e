#include "apps/commands.h"

#include <iostream>

namespace moe {

int Fail(const Status& status) {
  std::cerr << "error: " << status.message() << "\n";
  return 1;
}

Expected<DType> ParseDType(const std::string& name) {
  if (name == "f32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  if (name == "w8a8") return DType::kI8;
  return Status::Error("--dtype: '" + name + "' is not one of f32, bf16, w8a8");
}

}  // namespace moe
