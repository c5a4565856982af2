#include "testkit/control_client.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

namespace wsup::test {

using nlohmann::json;
using Steady = std::chrono::steady_clock;

namespace {

int MsLeft(Steady::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Steady::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

// The bound of a connect and of each send: the peer is a local process,
// so this is only reached when it is hung.
constexpr std::chrono::milliseconds kSendLimit = std::chrono::seconds(5);

int LimitMs(std::chrono::milliseconds limit) { return static_cast<int>(limit.count()); }

// Who answers on a control socket, for the errors: the client is not told
// which of the two it is.
SocketPeer ControlPeer() { return {"the supervisor or the front", "start it with this control socket"}; }

bool IsEvent(const json& m) { return m.is_object() && m.value("type", "") == "event"; }

}  // namespace

Status ControlClient::Connect(const std::string& path) {
  Close();
  path_ = path;
  auto ch = Channel::Connect(path, LimitMs(kSendLimit), ControlPeer());
  if (!ch.ok()) return ch.error();
  channel_ = std::move(*ch);
  return Status::Ok();
}

void ControlClient::Close() {
  channel_.Close();
  decoder_ = FrameDecoder();
  eof_ = false;
}

Status ControlClient::SendRaw(std::string_view bytes) {
  if (!connected()) return Unavailable(path_ + ": not connected; call Connect() first");
  return channel_.SendBytes(std::string(bytes), LimitMs(kSendLimit));
}

Status ControlClient::Send(const json& msg) {
  if (!connected()) return Unavailable(path_ + ": not connected; call Connect() first");
  // Without fds or a binary part, the channel sends EncodeFrame(msg) as it is.
  return channel_.Send(msg, {}, LimitMs(kSendLimit));
}

Status ControlClient::Fill(Steady::time_point deadline) {
  if (eof_) return IoError(path_ + ": the peer closed the connection");
  for (;;) {
    pollfd p{channel_.fd(), POLLIN, 0};
    int ready = ::poll(&p, 1, MsLeft(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready != 1) return Timeout(path_ + ": nothing arrived in time");
    char tmp[65536];
    ssize_t n = ::recv(channel_.fd(), tmp, sizeof(tmp), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      eof_ = true;
      return IoError(path_ + ": the peer closed the connection");
    }
    return decoder_.Feed(tmp, static_cast<size_t>(n));
  }
}

Result<json> ControlClient::Next(Steady::time_point deadline) {
  if (!connected()) return Unavailable(path_ + ": not connected; call Connect() first");
  for (;;) {
    auto m = decoder_.Next();
    if (!m.ok()) return m.error();
    if (m->has_value()) return std::move(**m);
    if (Status s = Fill(deadline); !s.ok()) return s.error();
  }
}

Result<json> ControlClient::Reply(std::chrono::milliseconds limit) {
  auto deadline = Steady::now() + limit;
  for (;;) {
    auto m = Next(deadline);
    if (!m.ok()) return m.error();
    if (!IsEvent(*m)) return m;
    events_.push_back(std::move(*m));
  }
}

Result<json> ControlClient::Call(const json& msg, std::chrono::milliseconds limit) {
  if (!connected()) {
    if (path_.empty()) return Unavailable("a control client with no socket path; call Connect() first");
    if (Status s = Connect(path_); !s.ok()) return s.error();
  }
  if (Status s = Send(msg); !s.ok()) {
    Close();
    return s.error();
  }
  auto r = Reply(limit);
  if (!r.ok()) Close();  // the next call connects again
  return r;
}

Result<json> ControlClient::WaitEvent(const std::string& kind, const std::string& field, const std::string& value,
                                      std::chrono::milliseconds limit) {
  auto deadline = Steady::now() + limit;
  for (;;) {
    for (const auto& e : events_) {
      if (e.value("kind", "") != kind) continue;
      if (field.empty() || (e.contains(field) && e[field] == value)) return e;
    }
    auto m = Next(deadline);
    if (!m.ok()) return m.error();
    if (IsEvent(*m)) events_.push_back(std::move(*m));
  }
}

bool ControlClient::WaitClosed(std::chrono::milliseconds limit) {
  if (!connected()) return true;
  auto deadline = Steady::now() + limit;
  while (!eof_) {
    Status s = Fill(deadline);
    if (!s.ok() && !eof_ && s.code() == Code::kTimeout) return false;
    // A refused frame means nothing more can be read; only EOF ends this.
  }
  return true;
}

std::vector<json> ControlClient::TakeEvents() {
  std::vector<json> e = std::move(events_);
  events_.clear();
  return e;
}

Result<std::string> HaproxyCommand(const std::string& socket, const std::string& command,
                                   std::chrono::milliseconds limit) {
  auto ch = Channel::Connect(socket, LimitMs(limit), {"HAProxy", "start it with this stats socket"});
  if (!ch.ok()) return ch.error();
  if (Status s = ch->SendBytes(command + "\n", LimitMs(limit)); !s.ok()) return s.error();
  auto deadline = Steady::now() + limit;
  std::string out;
  for (;;) {
    pollfd p{ch->fd(), POLLIN, 0};
    int ready = ::poll(&p, 1, MsLeft(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready != 1) return Timeout(socket + ": '" + command + "' got no complete answer in time");
    char tmp[65536];
    ssize_t n = ::recv(ch->fd(), tmp, sizeof(tmp), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return out;  // HAProxy closes after one command
    out.append(tmp, static_cast<size_t>(n));
  }
}

}  // namespace wsup::test
