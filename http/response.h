// HttpResponse and the byte formats of an HTTP/1.1 response: status line,
// headers, Content-Length or chunked framing, server-sent events.
//
// The server adds the framing headers itself (Content-Length or
// Transfer-Encoding, Connection, X-Request-Id), so a handler sets only what
// is its own (Content-Type, Retry-After, ...). Plain values; any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "http/request.h"

namespace wsup::http {

struct HttpResponse {
  int status = 200;
  std::vector<Header> headers;
  std::string body;

  static HttpResponse Json(int status, std::string body);
  static HttpResponse Text(int status, std::string body);
};

// "OK", "Not Found", ...; "Unknown" for codes this server never sends.
const char* StatusReason(int status);

// "HTTP/1.1 <status> <reason>\r\n" + headers + "\r\n" (the blank line included).
std::string SerializeHead(int status, const std::vector<Header>& headers);

// One chunk of a chunked body: "<hex length>\r\n<data>\r\n". Empty data
// gives the last chunk "0\r\n\r\n".
std::string EncodeChunk(std::string_view data);

// One server-sent event carrying `data` (which must not contain newlines):
// "data: <data>\n\n".
std::string SseEvent(std::string_view data);

// {"error": {"message": ..., "type": ...}} as compact JSON.
std::string ErrorJson(std::string_view message, std::string_view type);

}  // namespace wsup::http
