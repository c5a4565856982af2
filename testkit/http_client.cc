#include "testkit/http_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <strings.h>

namespace wsup::test {

using Clock = std::chrono::steady_clock;

namespace {
int RemainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}
}  // namespace

std::string HttpResult::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k.size() == name.size() && ::strncasecmp(k.data(), name.data(), k.size()) == 0) return v;
  }
  return "";
}

HttpConn::~HttpConn() { Close(); }
HttpConn::HttpConn(HttpConn&& o) noexcept { *this = std::move(o); }
HttpConn& HttpConn::operator=(HttpConn&& o) noexcept {
  if (this != &o) {
    Close();
    fd_ = o.fd_;
    buf_ = std::move(o.buf_);
    eof_ = o.eof_;
    o.fd_ = -1;
  }
  return *this;
}

void HttpConn::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  buf_.clear();
  eof_ = false;
}

bool HttpConn::Connect(int port, std::chrono::milliseconds limit) {
  Close();
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  if (rc < 0 && errno != EINPROGRESS) {
    ::close(fd);
    return false;
  }
  pollfd p{fd, POLLOUT, 0};
  if (::poll(&p, 1, static_cast<int>(limit.count())) != 1) {
    ::close(fd);
    return false;
  }
  int err = 0;
  socklen_t len = sizeof(err);
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    ::close(fd);
    return false;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fd_ = fd;
  return true;
}

bool HttpConn::Send(std::string_view data, std::chrono::milliseconds limit) {
  if (fd_ < 0) return false;
  auto deadline = Clock::now() + limit;
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, RemainingMs(deadline)) != 1) return false;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
  return true;
}

bool HttpConn::Fill(size_t n, Clock::time_point deadline) {
  while (buf_.size() < n) {
    if (eof_ || fd_ < 0) return false;
    char tmp[16384];
    ssize_t r = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (r > 0) {
      buf_.append(tmp, static_cast<size_t>(r));
      continue;
    }
    if (r == 0) {
      eof_ = true;
      return false;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      eof_ = true;
      return false;
    }
    pollfd p{fd_, POLLIN, 0};
    int left = RemainingMs(deadline);
    if (left == 0 || ::poll(&p, 1, left) != 1) return false;
  }
  return true;
}

size_t HttpConn::FillUntil(std::string_view delim, Clock::time_point deadline, size_t max) {
  for (;;) {
    size_t pos = buf_.find(delim);
    if (pos != std::string::npos) return pos;
    if (buf_.size() > max) return std::string::npos;
    if (!Fill(buf_.size() + 1, deadline)) return buf_.find(delim);
  }
}

HttpResult HttpConn::Read(std::chrono::milliseconds limit, bool head) {
  HttpResult r;
  auto deadline = Clock::now() + limit;
  size_t end = FillUntil("\r\n\r\n", deadline, 1 << 20);
  if (end == std::string::npos) {
    r.error = eof_ ? "connection closed before a response" : "timed out waiting for a response";
    return r;
  }
  std::string head_text = buf_.substr(0, end);
  buf_.erase(0, end + 4);
  size_t line_end = head_text.find("\r\n");
  std::string status_line = head_text.substr(0, line_end);
  if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12) {
    r.error = "bad status line: " + status_line;
    return r;
  }
  int status = std::atoi(status_line.c_str() + 9);
  size_t pos = line_end == std::string::npos ? head_text.size() : line_end + 2;
  while (pos < head_text.size()) {
    size_t e = head_text.find("\r\n", pos);
    if (e == std::string::npos) e = head_text.size();
    std::string line = head_text.substr(pos, e - pos);
    size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string v = line.substr(colon + 1);
      while (!v.empty() && v.front() == ' ') v.erase(0, 1);
      r.headers.emplace_back(line.substr(0, colon), v);
    }
    pos = e + 2;
  }
  if (status == 100) return Read(limit, head);  // interim answer
  std::string te = r.Header("Transfer-Encoding");
  std::string cl = r.Header("Content-Length");
  if (head || status == 204 || status == 304) {
    r.status = status;
    return r;
  }
  if (te.find("chunked") != std::string::npos) {
    r.chunked = true;
    for (;;) {
      size_t le = FillUntil("\r\n", deadline, 1 << 20);
      if (le == std::string::npos) {
        r.error = "stream ended inside a chunk header";
        return r;
      }
      size_t n = std::strtoul(buf_.substr(0, le).c_str(), nullptr, 16);
      buf_.erase(0, le + 2);
      if (!Fill(n + 2, deadline)) {
        r.error = "stream ended inside a chunk";
        return r;
      }
      r.body.append(buf_, 0, n);
      buf_.erase(0, n + 2);
      if (n == 0) break;
    }
  } else if (!cl.empty()) {
    size_t n = std::strtoul(cl.c_str(), nullptr, 10);
    if (!Fill(n, deadline)) {
      r.error = "connection closed inside the body";
      return r;
    }
    r.body = buf_.substr(0, n);
    buf_.erase(0, n);
  } else {
    while (Fill(buf_.size() + 1, deadline)) {
    }
    if (!eof_) {
      r.error = "timed out reading a body framed by close";
      return r;
    }
    r.body = std::move(buf_);
    buf_.clear();
  }
  r.status = status;
  return r;
}

bool HttpConn::WaitClosed(std::chrono::milliseconds limit) {
  auto deadline = Clock::now() + limit;
  for (;;) {
    buf_.clear();
    if (!Fill(1, deadline)) return eof_;
  }
}

HttpResult HttpRequestOnce(int port, const std::string& method, const std::string& path, const std::string& body,
                           std::chrono::milliseconds limit,
                           const std::vector<std::pair<std::string, std::string>>& headers) {
  HttpConn c;
  HttpResult r;
  if (!c.Connect(port)) {
    r.error = "cannot connect to port " + std::to_string(port);
    return r;
  }
  if (!c.Send(FormatRequest(method, path, body, headers))) {
    r.error = "cannot send the request";
    return r;
  }
  return c.Read(limit, method == "HEAD");
}

std::string FormatRequest(const std::string& method, const std::string& path, const std::string& body,
                          const std::vector<std::pair<std::string, std::string>>& headers) {
  std::string out = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (const auto& [k, v] : headers) out += k + ": " + v + "\r\n";
  if (!body.empty() || method == "POST") {
    out += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  out += "\r\n";
  out += body;
  return out;
}

std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t e = body.find("\n\n", pos);
    if (e == std::string::npos) break;
    std::string ev = body.substr(pos, e - pos);
    if (ev.rfind("data: ", 0) == 0) out.push_back(ev.substr(6));
    pos = e + 2;
  }
  return out;
}

}  // namespace wsup::test
