// Who may call an engine's control routes (http/control_auth.h).
#include <catch2/catch.hpp>

#include "http/control_auth.h"

namespace wsup::http {
namespace {

HttpRequest With(const std::vector<Header>& headers) {
  HttpRequest r;
  r.method = "GET";
  r.target = r.path = "/wsup/status";
  r.headers = headers;
  return r;
}

TEST_CASE("control auth: only the engine's own bearer token passes, and the refusal never shows it", "[http]") {
  const std::string token = "00112233445566778899aabbccddeeff";
  CHECK(CheckControlAuth(With({ControlAuthHeader(token)}), token).ok());
  CHECK(CheckControlAuth(With({{"authorization", "bearer  " + token + " "}}), token).ok());
  for (const auto& headers : std::vector<std::vector<Header>>{
           {},
           {{"Authorization", ""}},
           {{"Authorization", "Bearer"}},
           {{"Authorization", "Bearer "}},
           {{"Authorization", "Bearer 00112233445566778899aabbccddeefe"}},
           {{"Authorization", "Bearer " + token + "00"}},
           {{"Authorization", "Bearer " + token.substr(0, 31)}},
           {{"Authorization", "Basic " + token}},
           {{"Authorization", token}},
           {{"X-Token", token}},
       }) {
    Status st = CheckControlAuth(With(headers), token);
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == Code::kRefused);
    CHECK(st.error().message().find(token) == std::string::npos);
    CHECK(st.error().message().find("WSUP_CONTROL_TOKEN") != std::string::npos);
  }
  // An engine started without a token (by hand) answers everyone.
  CHECK(CheckControlAuth(With({}), "").ok());
}

TEST_CASE("control auth: /wsup and what is under it are control paths", "[http]") {
  for (const char* p : {"/wsup", "/wsup/", "/wsup/status", "/wsup/role", "/wsup/x/y"}) CHECK(IsControlPath(p));
  for (const char* p : {"/", "/wsupx", "/v1/wsup/role", "/health", "/v1/completions", ""}) CHECK_FALSE(IsControlPath(p));
}

}  // namespace
}  // namespace wsup::http
