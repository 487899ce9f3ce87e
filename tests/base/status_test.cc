#include "base/status.h"

#include <gtest/gtest.h>

namespace moe {
namespace {

Expected<int> Half(int x) {
  if (x % 2) return Status::Error(std::to_string(x) + " is odd");
  return x / 2;
}

Expected<int> Quarter(int x) {
  MOE_ASSIGN_OR_RETURN(int half, Half(x));
  return Half(half);
}

TEST(StatusTest, OkAndError) {
  EXPECT_TRUE(Status::Ok().ok());
  const Status error = Status::Error("bad").WithContext("file.json");
  EXPECT_FALSE(error.ok());
  EXPECT_EQ(error.message(), "file.json: bad");
}

TEST(ExpectedTest, PropagatesTheFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  const auto odd = Quarter(6);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().message(), "3 is odd");
}

}  // namespace
}  // namespace moe
