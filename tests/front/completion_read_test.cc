// The front's one reading of a completion body (front/completion.h:
// ReadCompletion): the JSON limits checked once, a parse only for a body
// that may ask for a stream, and the parsed request kept for every resume
// and hedge body.
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "front/completion.h"

using namespace wsup::front;
using nlohmann::json;

TEST_CASE("front completion read: a body past the JSON limits is the client's 400, in the limit's words", "[front][completion]") {
  const std::string deep = "{\"stream\":true,\"prompt\":" + std::string(100, '[') + std::string(100, ']') + "}";
  CompletionPlan p;
  p.stream = true;  // whatever was there is reset
  wsup::Status st = ReadCompletion(deep, 16, &p);
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().message() == CheckCompletionBody(deep).error().message());
  CHECK_FALSE(p.stream);
  CHECK(p.request.is_null());
}

TEST_CASE("front completion read: a body that cannot ask for a stream is not parsed", "[front][completion]") {
  CompletionPlan p;
  REQUIRE(ReadCompletion(R"({"prompt":"a","max_tokens":3})", 16, &p).ok());
  CHECK_FALSE(p.stream);
  CHECK(p.request.is_null());
  CHECK(p.upstream_body.empty());  // the client's body goes as sent
}

TEST_CASE("front completion read: a body that is not an object is forwarded as sent", "[front][completion]") {
  CompletionPlan p;
  REQUIRE(ReadCompletion(R"(["stream"])", 16, &p).ok());
  CHECK_FALSE(p.stream);
  REQUIRE(ReadCompletion(R"({"stream": tru)", 16, &p).ok());
  CHECK_FALSE(p.stream);
}

TEST_CASE("front completion read: a stream is planned once and its resumes are made from that plan", "[front][completion]") {
  CompletionPlan p;
  REQUIRE(ReadCompletion(R"({"prompt":"ab","stream":true})", 16, &p).ok());
  REQUIRE(p.stream);
  CHECK(p.resumable);
  CHECK(p.max_tokens == 16);
  CHECK(p.request["return_token_ids"] == true);
  CHECK(json::parse(p.upstream_body)["max_tokens"] == 16);
  json resume = json::parse(ResumeBody(p, {64, 65}, {7}, 15));
  CHECK(resume["prompt"] == json::array({64, 65, 7}));
  CHECK(resume["max_tokens"] == 15);
  // A non-streamed request mentioning "stream" is parsed but not rewritten.
  REQUIRE(ReadCompletion(R"({"prompt":"a","stream":false})", 16, &p).ok());
  CHECK_FALSE(p.stream);
}
