// CloseLatch (common/close_latch.h): done runs once, after the last part,
// whichever call comes last; a second Close neither starts again nor loses
// the newer done; done may destroy the owner.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "common/close_latch.h"

namespace wsup {
namespace {

// An owner with `parts` parts that close when the test says.
struct Owner {
  int open = 2;
  int begun = 0;
  CloseLatch close{[this] { return open == 0; }};
  void Close(std::function<void()> done) {
    if (!close.Begin(std::move(done))) return;
    ++begun;
    close.Check();
  }
  void PartClosed() {
    --open;
    close.Check();
  }
};

TEST_CASE("close latch: done runs once, after the last part", "[common][close_latch]") {
  Owner o;
  std::vector<std::string> ran;
  CHECK_FALSE(o.close.closing());
  o.PartClosed();  // a part closing on its own before Close runs nothing
  o.open = 2;
  o.Close([&] { ran.push_back("first"); });
  CHECK(o.close.closing());
  CHECK(ran.empty());
  o.PartClosed();
  CHECK(ran.empty());
  o.PartClosed();
  CHECK(ran == std::vector<std::string>{"first"});
  o.close.Check();
  CHECK(ran.size() == 1);
}

TEST_CASE("close latch: a second Close starts nothing again and its done replaces the first",
          "[common][close_latch]") {
  Owner o;
  std::vector<std::string> ran;
  o.Close([&] { ran.push_back("first"); });
  SECTION("with a done") {
    o.Close([&] { ran.push_back("second"); });
    o.PartClosed();
    o.PartClosed();
    CHECK(ran == std::vector<std::string>{"second"});
  }
  SECTION("without one, the first is kept") {
    o.Close(nullptr);
    o.PartClosed();
    o.PartClosed();
    CHECK(ran == std::vector<std::string>{"first"});
  }
  SECTION("after all has closed, a later Close runs its done at once") {
    o.PartClosed();
    o.PartClosed();
    o.Close([&] { ran.push_back("late"); });
    CHECK(ran == std::vector<std::string>{"first", "late"});
  }
  CHECK(o.begun == 1);
}

TEST_CASE("close latch: an owner with nothing open is done inside Close", "[common][close_latch]") {
  Owner o;
  o.open = 0;
  bool done = false;
  o.Close([&] { done = true; });
  CHECK(done);
}

TEST_CASE("close latch: done may destroy the owner", "[common][close_latch]") {
  auto o = std::make_unique<Owner>();
  o->Close([&] { o.reset(); });
  o->PartClosed();
  Owner* raw = o.get();
  raw->PartClosed();  // runs done, which frees the owner under it
  CHECK(o == nullptr);
}

}  // namespace
}  // namespace wsup
