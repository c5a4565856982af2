// HttpRequest and RequestParser: the server side of HTTP/1.1 request framing,
// independent of sockets and event loops, so the engine's server, the
// data-plane proxy (wsup-front) and the fuzz target share one parser.
//
// RequestParser wraps http-parser and adds the limits a server must enforce
// before it trusts a peer: bytes in the request line plus headers (431),
// number of headers (431), body size (413, refused as soon as a
// Content-Length announces it, or when chunks add up past it). Chunked
// bodies are decoded. Pipelined requests come out complete and in order.
// After an error the parser stops; the owner answers error().status and
// closes the connection (the framing of what follows cannot be trusted).
//
// Ownership and threads: a RequestParser belongs to one connection and is
// used by one thread at a time. HttpRequest is a plain value.
#pragma once

#include <http_parser.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "http/parser_settings.h"

namespace wsup::http {

struct Header {
  std::string name;
  std::string value;
};

// Case-insensitive ASCII comparison, as header names compare.
bool HeaderNameEquals(std::string_view a, std::string_view b);

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // the request-target as sent: "/v1/completions?x=1"
  std::string path;    // target up to '?'
  std::string query;   // after '?', without it
  int version_major = 1;
  int version_minor = 1;
  std::vector<Header> headers;  // in order, names as sent
  std::string body;             // decoded (chunked framing removed)
  bool keep_alive = true;       // from the version and the Connection header
  bool expect_continue = false;  // "Expect: 100-continue" was sent
  std::string request_id;        // X-Request-Id as sent, or one made by the server

  // The first header with this name (case-insensitive), or nullptr.
  const std::string* FindHeader(std::string_view name) const;
};

struct ParserLimits {
  size_t max_header_bytes = size_t{16} * 1024;  // request line plus all header lines
  size_t max_headers = 64;
  size_t max_body_bytes = 1 << 20;
};

// The answer owed to a peer whose bytes could not be parsed.
struct ParseError {
  int status = 0;  // 400, 413, 431, 501
  std::string message;
};

class RequestParser {
 public:
  explicit RequestParser(ParserLimits limits = {});
  RequestParser(const RequestParser&) = delete;
  RequestParser& operator=(const RequestParser&) = delete;

  // Feeds bytes from the peer; each request completed by them is appended
  // to `out`. Returns false once the stream is unusable; error() says why.
  // Bytes fed after an error are ignored.
  bool Feed(const char* data, size_t len, std::vector<HttpRequest>* out);

  bool failed() const { return failed_; }
  const ParseError& error() const { return error_; }
  // True between the first byte of a request and its completion.
  bool in_request() const { return in_request_; }
  // True once the current partial request's headers are complete.
  bool headers_done() const { return headers_done_; }

  // Called when a request's headers are complete, before its body arrives
  // (a server uses it to send "100 Continue").
  std::function<void(const HttpRequest&)> on_headers;

 private:
  template <typename>
  friend const http_parser_settings* ResponseSettings();
  template <typename>
  friend const http_parser_settings* RequestSettings();
  static int OnMessageBegin(http_parser* p);
  static int OnUrl(http_parser* p, const char* at, size_t len);
  static int OnHeaderField(http_parser* p, const char* at, size_t len);
  static int OnHeaderValue(http_parser* p, const char* at, size_t len);
  static int OnHeadersComplete(http_parser* p);
  static int OnBody(http_parser* p, const char* at, size_t len);
  static int OnMessageComplete(http_parser* p);

  int Fail(int status, std::string message);
  bool CountHeaderBytes(size_t len);

  ParserLimits limits_;
  http_parser parser_;
  HttpRequest current_;
  std::vector<HttpRequest>* out_ = nullptr;
  size_t header_bytes_ = 0;
  bool last_was_value_ = false;
  bool in_request_ = false;
  bool headers_done_ = false;
  bool failed_ = false;
  ParseError error_;
};

}  // namespace wsup::http
