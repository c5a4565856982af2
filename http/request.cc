#include "http/request.h"

#include <climits>
#include <cstring>

namespace wsup::http {

bool HeaderNameEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

const std::string* HttpRequest::FindHeader(std::string_view name) const {
  for (const auto& h : headers) {
    if (HeaderNameEquals(h.name, name)) return &h.value;
  }
  return nullptr;
}

RequestParser::RequestParser(ParserLimits limits) : limits_(limits) {
  http_parser_init(&parser_, HTTP_REQUEST);
  parser_.data = this;
}

bool RequestParser::Feed(const char* data, size_t len, std::vector<HttpRequest>* out) {
  if (failed_) return false;
  if (len == 0) return true;
  out_ = out;
  size_t parsed = http_parser_execute(&parser_, RequestSettings<RequestParser>(), data, len);
  out_ = nullptr;
  if (failed_) return false;
  auto err = static_cast<http_errno>(parser_.http_errno);
  if (err != HPE_OK) {
    if (err == HPE_HEADER_OVERFLOW) {
      Fail(431, "the request headers are larger than the parser allows; send fewer or shorter headers");
    } else {
      Fail(400, std::string("malformed HTTP request: ") + http_errno_description(err) +
                    "; send a valid HTTP/1.1 request");
    }
    return false;
  }
  if (parser_.upgrade) {
    Fail(501, "protocol upgrades (and CONNECT) are not supported; send plain HTTP/1.1 requests");
    return false;
  }
  if (parsed != len) {
    Fail(400, "malformed HTTP request: bytes left unparsed; send a valid HTTP/1.1 request");
    return false;
  }
  return true;
}

int RequestParser::Fail(int status, std::string message) {
  if (!failed_) {
    failed_ = true;
    error_.status = status;
    error_.message = std::move(message);
  }
  return -1;
}

bool RequestParser::CountHeaderBytes(size_t len) {
  header_bytes_ += len;
  if (header_bytes_ > limits_.max_header_bytes) {
    Fail(431, "the request line and headers exceed " + std::to_string(limits_.max_header_bytes) +
                  " bytes; send fewer or shorter headers");
    return false;
  }
  return true;
}

int RequestParser::OnMessageBegin(http_parser* p) {
  auto* self = static_cast<RequestParser*>(p->data);
  self->current_ = HttpRequest();
  self->header_bytes_ = 0;
  self->last_was_value_ = false;
  self->in_request_ = true;
  self->headers_done_ = false;
  return 0;
}

int RequestParser::OnUrl(http_parser* p, const char* at, size_t len) {
  auto* self = static_cast<RequestParser*>(p->data);
  if (!self->CountHeaderBytes(len)) return -1;
  self->current_.target.append(at, len);
  return 0;
}

int RequestParser::OnHeaderField(http_parser* p, const char* at, size_t len) {
  auto* self = static_cast<RequestParser*>(p->data);
  // Each header line costs its CRLF and ": " too, so many empty headers
  // cannot slip under the byte limit.
  if (!self->CountHeaderBytes(len + (self->last_was_value_ || self->current_.headers.empty() ? 4 : 0)))
    return -1;
  if (self->current_.headers.empty() || self->last_was_value_) {
    if (self->current_.headers.size() >= self->limits_.max_headers) {
      return self->Fail(431, "the request has more than " + std::to_string(self->limits_.max_headers) +
                                 " headers; send fewer headers");
    }
    self->current_.headers.push_back(Header{});
  }
  self->current_.headers.back().name.append(at, len);
  self->last_was_value_ = false;
  return 0;
}

int RequestParser::OnHeaderValue(http_parser* p, const char* at, size_t len) {
  auto* self = static_cast<RequestParser*>(p->data);
  if (!self->CountHeaderBytes(len)) return -1;
  if (self->current_.headers.empty()) return self->Fail(400, "header value without a name");
  self->current_.headers.back().value.append(at, len);
  self->last_was_value_ = true;
  return 0;
}

int RequestParser::OnHeadersComplete(http_parser* p) {
  auto* self = static_cast<RequestParser*>(p->data);
  HttpRequest& r = self->current_;
  r.method = http_method_str(static_cast<http_method>(p->method));
  r.version_major = p->http_major;
  r.version_minor = p->http_minor;
  r.keep_alive = http_should_keep_alive(p) != 0;
  size_t q = r.target.find('?');
  r.path = r.target.substr(0, q);
  if (q != std::string::npos) r.query = r.target.substr(q + 1);
  if (const std::string* e = r.FindHeader("Expect")) {
    if (HeaderNameEquals(*e, "100-continue")) {
      r.expect_continue = true;
    } else {
      return self->Fail(400, "unsupported Expect header '" + *e + "'; only 100-continue is understood");
    }
  }
  // The one transfer coding understood is chunked, alone: a body in any
  // other coding (gzip, chunked) would be taken as plain bytes after its
  // chunked framing is removed, and a proxy must not forward what it
  // cannot read (RFC 9112 6.1: 501 for an unknown coding).
  int te_codings = 0;
  for (const auto& h : r.headers) {
    if (!HeaderNameEquals(h.name, "Transfer-Encoding")) continue;
    size_t at = 0;
    while (at <= h.value.size()) {
      size_t comma = h.value.find(',', at);
      std::string coding = h.value.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      while (!coding.empty() && (coding.front() == ' ' || coding.front() == '\t')) coding.erase(0, 1);
      while (!coding.empty() && (coding.back() == ' ' || coding.back() == '\t')) coding.pop_back();
      if (!coding.empty()) {
        ++te_codings;
        if (!HeaderNameEquals(coding, "chunked")) {
          return self->Fail(501, "Transfer-Encoding '" + coding.substr(0, 64) +
                                     "' is not supported; send the body as it is, with Content-Length or "
                                     "Transfer-Encoding: chunked alone");
        }
      }
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
  }
  if (te_codings > 1) {
    return self->Fail(400, "Transfer-Encoding lists chunked more than once; send it once");
  }
  // A Content-Length past the limit is refused before any of the body is read.
  if (p->content_length != ULLONG_MAX && p->content_length > self->limits_.max_body_bytes) {
    return self->Fail(413, "the request body of " + std::to_string(p->content_length) +
                               " bytes exceeds the limit of " + std::to_string(self->limits_.max_body_bytes) +
                               " bytes; send a smaller body");
  }
  self->headers_done_ = true;
  if (self->on_headers) self->on_headers(r);
  return 0;
}

int RequestParser::OnBody(http_parser* p, const char* at, size_t len) {
  auto* self = static_cast<RequestParser*>(p->data);
  if (self->current_.body.size() + len > self->limits_.max_body_bytes) {
    return self->Fail(413, "the request body exceeds the limit of " + std::to_string(self->limits_.max_body_bytes) +
                               " bytes; send a smaller body");
  }
  self->current_.body.append(at, len);
  return 0;
}

int RequestParser::OnMessageComplete(http_parser* p) {
  auto* self = static_cast<RequestParser*>(p->data);
  self->in_request_ = false;
  self->headers_done_ = false;
  if (self->out_) self->out_->push_back(std::move(self->current_));
  self->current_ = HttpRequest();
  return 0;
}

}  // namespace wsup::http
