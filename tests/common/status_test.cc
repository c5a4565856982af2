#include <catch2/catch.hpp>

#include "common/status.h"

namespace wsup {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgument(std::to_string(x) + " is odd; pass an even number");
  return x / 2;
}

Result<int> Quarter(int x) {
  WSUP_ASSIGN_OR_RETURN(int h, Half(x));
  WSUP_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST_CASE("Result carries a value or an error with context") {
  REQUIRE(Quarter(8).ok());
  CHECK(*Quarter(8) == 2);
  auto bad = Quarter(6);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code() == Code::kInvalidArgument);
  CHECK(bad.error().message() == "3 is odd; pass an even number");
  CHECK(bad.error().With("quarter").ToString() == "invalid argument: quarter: 3 is odd; pass an even number");
}

TEST_CASE("Status propagates through WSUP_RETURN_IF_ERROR") {
  auto f = [](bool fail) -> Status {
    WSUP_RETURN_IF_ERROR(fail ? Status(NotFound("x")) : Status::Ok());
    return Status::Ok();
  };
  CHECK(f(false).ok());
  CHECK(f(true).code() == Code::kNotFound);
}

}  // namespace
}  // namespace wsup
