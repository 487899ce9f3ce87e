#include "base/status.h"

namespace moe {

const std::string& Status::message() const {
  static const std::string kEmpty;
  return message_ ? *message_ : kEmpty;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status::Error(context + ": " + *message_);
}

}  // namespace moe
