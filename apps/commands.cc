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
  return Status::Error("--dtype: '" + name + "' is not one of f32, bf16");
}

}  // namespace moe
