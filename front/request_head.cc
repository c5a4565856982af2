#include "front/request_head.h"

#include <strings.h>

#include <charconv>
#include <cstdint>

namespace wsup::front {

using http::Header;
using http::HeaderNameEquals;

bool IsHopByHop(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "Connection",          "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
      "TE",                  "Trailer",    "Transfer-Encoding", "Upgrade",           "Content-Length",
  };
  for (std::string_view n : kNames) {
    if (HeaderNameEquals(name, n)) return true;
  }
  return false;
}

bool ListedIn(std::string_view connection_value, std::string_view name) {
  size_t pos = 0;
  while (pos <= connection_value.size()) {
    size_t comma = connection_value.find(',', pos);
    if (comma == std::string_view::npos) comma = connection_value.size();
    std::string_view tok = connection_value.substr(pos, comma - pos);
    while (!tok.empty() && (tok.front() == ' ' || tok.front() == '\t')) tok.remove_prefix(1);
    while (!tok.empty() && (tok.back() == ' ' || tok.back() == '\t')) tok.remove_suffix(1);
    if (!tok.empty() && HeaderNameEquals(tok, name)) return true;
    pos = comma + 1;
  }
  return false;
}

const std::string* FindHeader(const std::vector<Header>& headers, std::string_view name) {
  for (const auto& h : headers) {
    if (HeaderNameEquals(h.name, name)) return &h.value;
  }
  return nullptr;
}

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && ::strncasecmp(s.data(), prefix.data(), prefix.size()) == 0;
}

bool IsEventStream(const std::vector<Header>& headers) {
  const std::string* content_type = FindHeader(headers, "Content-Type");
  return content_type && StartsWithNoCase(*content_type, "text/event-stream");
}

void BuildRequestHead(const http::HttpRequest& r, std::string_view host, std::string_view body, bool cut,
                      std::string* out, std::string_view target) {
  std::string& head = *out;
  const std::string* connection = r.FindHeader("Connection");
  head.clear();
  head.reserve(128 + r.target.size() + r.headers.size() * 48);
  head += r.method;
  head += ' ';
  head += target.empty() ? std::string_view(r.target) : target;
  head += " HTTP/1.1\r\n";
  bool have_host = false;
  for (const auto& h : r.headers) {
    // X-Request-Id and X-Wsup-Resume are the front's to set, never a
    // client's; X-Wsup-Probe is the supervisor's (an engine admits a probe
    // ahead of its queue).
    if (IsHopByHop(h.name) || HeaderNameEquals(h.name, "Expect") || HeaderNameEquals(h.name, "X-Request-Id") ||
        HeaderNameEquals(h.name, "X-Wsup-Resume") || HeaderNameEquals(h.name, "X-Wsup-Probe")) {
      continue;
    }
    if (connection && ListedIn(*connection, h.name)) continue;
    if (HeaderNameEquals(h.name, "Host")) have_host = true;
    head += h.name;
    head += ": ";
    head += h.value;
    head += "\r\n";
  }
  if (!have_host) {
    head += "Host: ";
    head += host;
    head += "\r\n";
  }
  head += "X-Request-Id: ";
  head += r.request_id;
  head += "\r\n";
  if (cut) head += "X-Wsup-Resume: cut\r\n";
  if (!body.empty() || r.method == "POST" || r.method == "PUT" || r.method == "PATCH") {
    char len[32];
    auto [end, ec] = std::to_chars(len, len + sizeof(len), body.size());
    (void)ec;  // 32 chars hold any size_t
    head += "Content-Length: ";
    head.append(len, end);
    head += "\r\n";
  }
  head += "\r\n";
}

std::vector<Header> RelayedHeaders(std::vector<Header>* headers, size_t* announced) {
  // Copied: the headers are moved out below. (Usually "keep-alive": no allocation.)
  std::string connection;
  if (const std::string* c = FindHeader(*headers, "Connection")) connection = *c;
  const bool chunked = FindHeader(*headers, "Transfer-Encoding") != nullptr;
  *announced = SIZE_MAX;
  if (const std::string* length = FindHeader(*headers, "Content-Length"); length && !chunked) {
    size_t n = 0;
    auto [end, ec] = std::from_chars(length->data(), length->data() + length->size(), n);
    if (ec == std::errc() && end == length->data() + length->size()) *announced = n;
  }
  std::vector<Header> out;
  out.reserve(headers->size());
  for (auto& h : *headers) {
    if (IsHopByHop(h.name) || HeaderNameEquals(h.name, "X-Request-Id") || HeaderNameEquals(h.name, "Server")) continue;
    if (!connection.empty() && ListedIn(connection, h.name)) continue;
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace wsup::front
