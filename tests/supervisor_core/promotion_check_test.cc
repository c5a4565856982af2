// The promotion check's rules (supervisor/promotion_check.h): facts about
// the process decide, an old probe answer only adds a note.
#include "supervisor/promotion_check.h"

#include <catch2/catch.hpp>

namespace wsup {
namespace {

TEST_CASE("promotion: a running standby with a fresh or no probe answer is promoted without a note", "[logic]") {
  for (char state : {'R', 'S', 'D'}) {
    auto c = CheckPromotion(42, state, 100, 5000);
    CHECK(c.unfit.empty());
    CHECK(c.note.empty());
  }
  auto adopted = CheckPromotion(42, 'S', -1, 5000);  // never probed by this supervisor
  CHECK(adopted.unfit.empty());
  CHECK(adopted.note.empty());
  CHECK(CheckPromotion(42, 'S', 5000, 5000).note.empty());  // at the limit is not past it
}

TEST_CASE("promotion: no process, a gone, stopped or exiting one is unfit, whatever its probes said", "[logic]") {
  CHECK(CheckPromotion(0, 'R', 10, 5000).unfit == "it has no process");
  CHECK(CheckPromotion(42, 0, 10, 5000).unfit == "its process 42 is gone");
  for (char state : {'T', 't'}) {
    auto c = CheckPromotion(42, state, 10, 5000);
    CHECK(c.unfit.find("is stopped") != std::string::npos);
    CHECK(c.note.empty());
  }
  for (char state : {'Z', 'X', 'x'}) CHECK(CheckPromotion(42, state, 10, 5000).unfit == "its process 42 is exiting");
}

TEST_CASE("promotion: an old probe answer on a running process is promoted with a note that names the age",
          "[logic]") {
  // A loaded machine delays probes; failing the only running engine at a
  // crash would leave nothing to serve.
  auto c = CheckPromotion(42, 'R', 9001, 9000);
  CHECK(c.unfit.empty());
  CHECK(c.note.find("9001 ms old") != std::string::npos);
  CHECK(c.note.find("9000 ms") != std::string::npos);
  CHECK(c.note.find("its probes decide") != std::string::npos);
}

}  // namespace
}  // namespace wsup
