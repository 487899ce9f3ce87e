// Status and Expected<T>: the error type at every boundary that reads user input (files,
// command lines, network). Programmer errors use MOE_CHECK instead.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "base/check.h"

namespace moe {

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return !message_.has_value(); }
  const std::string& message() const;

  // Prefixes context, e.g. the file name, to the message of a failed status.
  Status WithContext(const std::string& context) const;

 private:
  explicit Status(std::string message) : message_(std::move(message)) {}
  std::optional<std::string> message_;
};

template <typename T>
class Expected {
 public:
  Expected(T value) : state_(std::move(value)) {}  // NOLINT: implicit by design
  Expected(Status status) : state_(std::move(status)) {  // NOLINT: implicit by design
    MOE_CHECK(!std::get<Status>(state_).ok(), "Expected built from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(state_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(state_); }

  T& value() & {
    MOE_CHECK(ok(), "value() of a failed Expected: %s", status().message().c_str());
    return std::get<T>(state_);
  }
  const T& value() const& {
    MOE_CHECK(ok(), "value() of a failed Expected: %s", status().message().c_str());
    return std::get<T>(state_);
  }
  T&& value() && {
    MOE_CHECK(ok(), "value() of a failed Expected: %s", status().message().c_str());
    return std::get<T>(std::move(state_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> state_;
};

}  // namespace moe

#define MOE_CONCAT_INNER(a, b) a##b
#define MOE_CONCAT(a, b) MOE_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` (a Status) failed.
#define MOE_RETURN_IF_ERROR(expr)                \
  do {                                           \
    ::moe::Status moe_status_ = (expr);          \
    if (!moe_status_.ok()) return moe_status_;   \
  } while (0)

// `MOE_ASSIGN_OR_RETURN(auto x, Foo());` declares x from an Expected or returns its Status.
#define MOE_ASSIGN_OR_RETURN(lhs, expr) \
  MOE_ASSIGN_OR_RETURN_IMPL(MOE_CONCAT(moe_expected_, __LINE__), lhs, expr)
#define MOE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
