// A blocking HTTP/1.1 client for tests, on plain sockets. Every wait is
// bounded by poll() with a deadline, so a server that misbehaves fails the
// test instead of hanging it. Used by the http and the engine tests.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace wsup::test {

struct HttpResult {
  int status = 0;  // 0: no (complete) response
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;     // decoded (chunked framing removed)
  bool chunked = false;
  std::string error;    // why status is 0
  std::string Header(std::string_view name) const;  // "" when absent
};

class HttpConn {
 public:
  HttpConn() = default;
  ~HttpConn();
  HttpConn(HttpConn&& o) noexcept;
  HttpConn& operator=(HttpConn&& o) noexcept;

  // Connects to 127.0.0.1:port; false on failure.
  bool Connect(int port, std::chrono::milliseconds limit = std::chrono::seconds(5));
  bool connected() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // Sends all bytes or returns false (peer closed, timeout).
  bool Send(std::string_view data, std::chrono::milliseconds limit = std::chrono::seconds(5));
  // Reads one response; for a response to HEAD pass head=true.
  HttpResult Read(std::chrono::milliseconds limit = std::chrono::seconds(30), bool head = false);
  // True once the peer has closed (EOF or reset) within limit; drops any bytes read.
  bool WaitClosed(std::chrono::milliseconds limit);
  void Close();

 private:
  // Ensures buf_ holds at least n bytes; false on EOF/timeout.
  bool Fill(size_t n, std::chrono::steady_clock::time_point deadline);
  // Reads until buf_ contains `delim`; returns its position or npos.
  size_t FillUntil(std::string_view delim, std::chrono::steady_clock::time_point deadline, size_t max);
  int fd_ = -1;
  std::string buf_;
  bool eof_ = false;
};

// One request on a new connection.
HttpResult HttpRequestOnce(int port, const std::string& method, const std::string& path,
                           const std::string& body = "",
                           std::chrono::milliseconds limit = std::chrono::seconds(60),
                           const std::vector<std::pair<std::string, std::string>>& headers = {});

// A formatted request with Content-Length (when body or POST).
std::string FormatRequest(const std::string& method, const std::string& path, const std::string& body,
                          const std::vector<std::pair<std::string, std::string>>& headers = {});

// The data payloads of a server-sent event stream ("data: X\n\n" -> X).
std::vector<std::string> SseData(const std::string& body);

}  // namespace wsup::test
