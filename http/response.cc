#include "http/response.h"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace wsup::http {

namespace {

HttpResponse WithBody(int status, const char* content_type, std::string body) {
  HttpResponse r;
  r.status = status;
  r.headers.push_back({"Content-Type", content_type});
  r.body = std::move(body);
  return r;
}

}  // namespace

HttpResponse HttpResponse::Json(int status, std::string body) {
  return WithBody(status, "application/json", std::move(body));
}

HttpResponse HttpResponse::Text(int status, std::string body) {
  return WithBody(status, "text/plain; charset=utf-8", std::move(body));
}

const char* StatusReason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Unknown";
  }
}

std::string SerializeHead(int status, const std::vector<Header>& headers) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + StatusReason(status) + "\r\n";
  for (const auto& h : headers) {
    out += h.name;
    out += ": ";
    out += h.value;
    out += "\r\n";
  }
  out += "\r\n";
  return out;
}

std::string EncodeChunk(std::string_view data) {
  char len[32];
  std::snprintf(len, sizeof(len), "%zx\r\n", data.size());
  std::string out(len);
  out.append(data);
  out += "\r\n";
  return out;
}

std::string SseEvent(std::string_view data) {
  std::string out = "data: ";
  out.append(data);
  out += "\n\n";
  return out;
}

std::string ErrorJson(std::string_view message, std::string_view type) {
  nlohmann::json j;
  // Messages may quote bytes from a peer; replace invalid UTF-8 rather than throw.
  j["error"] = {{"message", std::string(message)}, {"type", std::string(type)}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace wsup::http
