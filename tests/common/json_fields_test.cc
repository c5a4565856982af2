// Checked field reads: a field of another type is an error naming the
// field, the type it has and the type it needs, never an exception.
#include "common/json_fields.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

namespace wsup {
namespace {

using nlohmann::json;

TEST_CASE("json fields: a field of the wrong type is an error naming it, its type and the type it needs",
          "[json_fields]") {
  const json msg = {{"type", "failover"}, {"drill", "yes"}, {"kill", 3}, {"n", 1.5}, {"o", {{"a", 1}}}};
  auto kill = FieldOr<bool>(msg, "kill", false);
  REQUIRE_FALSE(kill.ok());
  CHECK(kill.error().message() == "field 'kill' is an integer (3), not true or false");
  auto drill = Field<bool>(msg, "drill");
  REQUIRE_FALSE(drill.ok());
  CHECK(drill.error().message() == "field 'drill' is a string (\"yes\"), not true or false");
  auto type = FieldOr<int64_t>(msg, "type", 0);
  REQUIRE_FALSE(type.ok());
  CHECK(type.error().message() == "field 'type' is a string (\"failover\"), not an integer");
  auto frac = Field<int64_t>(msg, "n");
  REQUIRE_FALSE(frac.ok());
  CHECK(frac.error().message() == "field 'n' is a number (1.5), not an integer");
  auto obj = Field<std::string>(msg, "o");
  REQUIRE_FALSE(obj.ok());
  CHECK(obj.error().message() == "field 'o' is an object ({...}), not a string");
  CHECK(ObjectFieldOr(msg, "kill").error().message() == "field 'kill' is an integer (3), not an object");
  CHECK(ArrayFieldOr(msg, "o").error().message() == "field 'o' is an object ({...}), not an array");
}

TEST_CASE("json fields: absent and null read as the fallback, required fields say they are missing",
          "[json_fields]") {
  const json msg = {{"a", nullptr}, {"b", true}, {"s", "x"}, {"o", {{"k", 1}}}, {"l", {1, 2}}};
  CHECK(*FieldOr<bool>(msg, "a", true) == true);
  CHECK(*FieldOr<bool>(msg, "missing", false) == false);
  CHECK(*FieldOr<bool>(msg, "b", false) == true);
  CHECK(*FieldOr<std::string>(msg, "s", "") == "x");
  CHECK(*ObjectFieldOr(msg, "a") == nullptr);
  CHECK(*ObjectFieldOr(msg, "missing") == nullptr);
  REQUIRE(*ObjectFieldOr(msg, "o") != nullptr);
  CHECK((**ObjectFieldOr(msg, "o"))["k"] == 1);
  REQUIRE(*ArrayFieldOr(msg, "l") != nullptr);
  CHECK((*ArrayFieldOr(msg, "l"))->size() == 2);
  auto missing = Field<std::string>(msg, "type");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message() == "field 'type' is missing; it must be a string");
}

TEST_CASE("json fields: integers are checked against the range of the type asked for", "[json_fields]") {
  const json msg = {{"big", uint64_t{1} << 63}, {"neg", -1}, {"huge_int", int64_t{1} << 40}, {"f", 2.0}};
  auto big = Field<int64_t>(msg, "big");
  REQUIRE_FALSE(big.ok());
  CHECK(big.error().message() ==
        "field 'big' is 9223372036854775808, out of range for an integer (-9223372036854775808 to "
        "9223372036854775807)");
  CHECK(*Field<uint64_t>(msg, "big") == (uint64_t{1} << 63));
  auto neg = Field<uint64_t>(msg, "neg");
  REQUIRE_FALSE(neg.ok());
  CHECK(neg.error().message().find("field 'neg' is -1, out of range for a non-negative integer") == 0);
  CHECK(*Field<int64_t>(msg, "neg") == -1);
  auto narrow = Field<int>(msg, "huge_int");
  REQUIRE_FALSE(narrow.ok());
  CHECK(narrow.error().message().find("out of range for an integer (-2147483648 to 2147483647)") !=
        std::string::npos);
  // A float is never an integer, even a whole one; any number is a double.
  CHECK_FALSE(Field<int64_t>(msg, "f").ok());
  CHECK(*Field<double>(msg, "f") == 2.0);
  CHECK(*Field<double>(msg, "neg") == -1.0);
}

TEST_CASE("json fields: a message that is no object is an error, and odd values are shown safely",
          "[json_fields]") {
  for (const json& not_object : {json(3), json("s"), json::array({1}), json(nullptr)}) {
    auto r = FieldOr<bool>(not_object, "kill", false);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message().rfind("expected a JSON object, got ", 0) == 0);
  }
  // Invalid UTF-8 and long values in a message are replaced and cut, never thrown on.
  const json msg = {{"s", std::string("\xff\xfe", 2)}, {"long", std::string(500, 'a')}};
  auto bad = Field<bool>(msg, "s");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message().find("is a string") != std::string::npos);
  auto cut = Field<int>(msg, "long");
  REQUIRE_FALSE(cut.ok());
  CHECK(cut.error().message().size() < 120);
  CHECK(cut.error().message().find("...") != std::string::npos);
}

}  // namespace
}  // namespace wsup
