#include "tests/front/front_harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace wsup::test {

using nlohmann::json;

json FrontStatus(ControlClient& ctl) {
  auto st = ctl.Call({{"type", "status"}});
  INFO((st.ok() ? st->dump() : st.error().ToString()));
  REQUIRE(st.ok());
  REQUIRE((*st)["ok"] == true);
  return *st;
}

json SetRoutes(const std::string& active, const std::string& standby, int64_t epoch) {
  return {{"type", "set_routes"},
          {"active", active.empty() ? json(nullptr) : json(active)},
          {"standby", standby.empty() ? json(nullptr) : json(standby)},
          {"epoch", epoch}};
}

std::unique_ptr<FrontProcess> FrontProcess::Start(const std::vector<std::string>& args,
                                                  const std::vector<int>& extra_fds) {
  auto f = std::make_unique<FrontProcess>();
  f->control_ = f->dir_.Join("ctl.sock");
  f->log_ = f->dir_.Join("front.log");
  std::vector<std::string> argv = {BinPath("wsup-front"), "--control", f->control_};
  bool has_listen = false;
  for (const auto& a : args) has_listen = has_listen || a == "--listen" || a == "--listen-fd";
  if (!has_listen) {
    argv.push_back("--listen");
    argv.push_back("127.0.0.1:0");
  }
  argv.insert(argv.end(), args.begin(), args.end());
  f->child_ = Child::Start(argv, f->log_, extra_fds);
  bool up = WaitFor(
      [&] {
        std::string log = ReadAll(f->log_);
        size_t pos = log.find("listening on ");
        if (pos == std::string::npos) return false;
        size_t colon = log.find(':', pos + 13);
        size_t nl = log.find('\n', pos);
        if (colon == std::string::npos || nl == std::string::npos) return false;
        f->port_ = std::atoi(log.substr(colon + 1, nl - colon - 1).c_str());
        return f->port_ > 0;
      },
      std::chrono::seconds(10));
  INFO(ReadAll(f->log_));
  REQUIRE(up);
  return f;
}

RefusingPort::RefusingPort() {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
}

RefusingPort::~RefusingPort() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace wsup::test
