#include <catch2/catch.hpp>

#include <string>

#include "common/json_limits.h"

namespace wsup {
namespace {

std::string Nest(int depth, char open = '[', char close = ']') {
  return std::string(static_cast<size_t>(depth), open) + std::string(static_cast<size_t>(depth), close);
}

std::string NestObjects(int depth) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += "{\"a\":";
  s += "1";
  s += std::string(static_cast<size_t>(depth), '}');
  return s;
}

TEST_CASE("JsonNestingDepth counts brackets outside strings only") {
  CHECK(JsonNestingDepth("") == 0);
  CHECK(JsonNestingDepth("1") == 0);
  CHECK(JsonNestingDepth("[]") == 1);
  CHECK(JsonNestingDepth(R"({"a":[1,{"b":[]}],"c":{}})") == 4);
  CHECK(JsonNestingDepth(NestObjects(10)) == 10);
  // Brackets in strings, with escaped quotes and backslashes around them.
  CHECK(JsonNestingDepth(R"({"s":"[[[[{{{{"})") == 1);
  CHECK(JsonNestingDepth(R"({"s":"\"[[[[\\"})") == 1);
  CHECK(JsonNestingDepth(R"(["\\",[["x"]]])") == 3);
  // The scan stops once past the bound.
  CHECK(JsonNestingDepth(Nest(100000), 64) == 65);
  // Stray closers cannot lower the depth below zero to hide nesting after them.
  CHECK(JsonNestingDepth("]]]]]]" + Nest(70)) == 65);
}

TEST_CASE("CheckJsonLimits allows the limit and refuses one level more, naming what, the limit and the fix") {
  CHECK(CheckJsonLimits(Nest(kMaxJsonDepth), "x", "fix").ok());
  CHECK(CheckJsonLimits(NestObjects(kMaxJsonDepth), "x", "fix").ok());
  for (const std::string& deep : {Nest(kMaxJsonDepth + 1), NestObjects(kMaxJsonDepth + 1), Nest(70000, '{', '}'),
                                  "{\"stream\":true,\"prompt\":" + Nest(70000) + "}"}) {
    INFO(deep.substr(0, 40));
    Status s = CheckJsonLimits(deep, "the request body", "send a flatter object");
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == Code::kInvalidArgument);
    CHECK(s.error().message() ==
          "the request body is JSON nested deeper than the limit of 64 levels; send a flatter object");
  }
  // Deep inside a string is not nesting.
  CHECK(CheckJsonLimits("{\"prompt\":\"" + Nest(70000) + "\"}", "x", "fix").ok());
}

TEST_CASE("CheckJsonLimits refuses a text over its size bound") {
  CHECK(CheckJsonLimits(std::string(100, ' '), "x", "fix", 100).ok());
  Status s = CheckJsonLimits(std::string(101, ' '), "the status", "send less", 100);
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().message() == "the status is 101 bytes of JSON, more than the limit of 100 bytes; send less");
}

TEST_CASE("ParseJsonChecked parses within the limits and names what is wrong otherwise") {
  auto ok = ParseJsonChecked(R"({"a":[1,2]})", "x", "fix");
  REQUIRE(ok.ok());
  CHECK((*ok)["a"][1] == 2);
  auto ordered = ParseJsonChecked<nlohmann::ordered_json>(R"({"b":1,"a":2})", "x", "fix");
  REQUIRE(ordered.ok());
  CHECK(ordered->begin().key() == "b");

  auto bad = ParseJsonChecked("{nope", "engine status", "answer JSON");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message() == "engine status is not valid JSON; answer JSON");
  auto deep = ParseJsonChecked(Nest(70000), "engine status", "answer JSON");
  REQUIRE_FALSE(deep.ok());
  CHECK(deep.error().message().find("limit of 64 levels") != std::string::npos);
}

}  // namespace
}  // namespace wsup
