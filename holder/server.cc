// HolderServer's sockets and connections (holder/server.h): the listening
// socket, admission at the connection limit, each connection's reads,
// writes and deadlines, and closing. What a request gets is
// server_requests.cc (and server_layouts.cc for engine-made layouts).
#include "holder/server.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <vector>

#include "common/fs.h"
#include "holder/server_conn.h"

namespace wsup {

using nlohmann::json;

namespace {

constexpr int kReadsPerEvent = 4;       // x 64 KiB: bounds one client's share of a loop turn
constexpr int kAcceptsPerEvent = 128;
constexpr int kAcceptPauseMs = 100;

// Sends one message without waiting, on a socket that is about to be closed,
// so the peer learns why. Whatever does not fit is lost; that is fine.
void TellOnce(int fd, const Error& e) {
  auto frame = OutgoingFrame::Make(EncodeError(e), {});
  if (frame.ok()) (void)frame->SendSome(fd);
}

}  // namespace

// ---------------------------------------------------------------- lifecycle

HolderServer::HolderServer(uv_loop_t* loop, const Arena& arena, Fingerprint fingerprint, ServerOptions opts)
    : loop_(loop), arena_(&arena), fingerprint_(std::move(fingerprint)), opts_(std::move(opts)) {}

HolderServer::HolderServer(uv_loop_t* loop, LayoutStore* layouts, Fingerprint fingerprint, ServerOptions opts)
    : loop_(loop), layouts_(layouts), fingerprint_(std::move(fingerprint)), opts_(std::move(opts)) {}

HolderServer::~HolderServer() {
  if (!conns_.empty() || closing_conns_ > 0 || open_server_handles_ > 0) {
    spdlog::error("holder server destroyed with {} connections and {} handles open; Close() it and run the "
                  "loop until its callback fires first",
                  conns_.size() + closing_conns_, open_server_handles_);
  }
}

Status HolderServer::Start() {
  if (started_ || closing_) return Internal("HolderServer::Start called twice");
  const std::string& path = opts_.socket_path;
  if ((arena_ == nullptr) == (layouts_ == nullptr)) {
    return Internal("HolderServer needs either an arena or a layout store");
  }
  if (arena_ != nullptr) {
    // The tensor table is the same for every client: encode it once.
    WSUP_ASSIGN_OR_RETURN(std::string table, EncodeTensorTable(arena_->manifest().entries));
    table_ = std::make_shared<const std::string>(std::move(table));
    table_manifest_ = ManifestHeaderToJson(arena_->manifest(), table_->size());
  }
  WSUP_RETURN_IF_ERROR(PrepareSocketPath(path));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError(path + ": cannot create a socket", errno);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  // The socket file must never exist with a wider mode, not even briefly.
  mode_t old_mask = ::umask(0177);
  int rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int bind_errno = errno;
  ::umask(old_mask);
  if (rc != 0) {
    if (bind_errno == EADDRINUSE) {
      return Refused(path + ": another process bound this socket just now; stop the other holder or give "
                     "this one another --socket");
    }
    return ErrnoError(path + ": cannot bind the holder socket", bind_errno);
  }
  struct stat st{};
  if (::chmod(path.c_str(), 0600) != 0 || ::stat(path.c_str(), &st) != 0) {
    int e = errno;
    ::unlink(path.c_str());
    return ErrnoError(path + ": cannot set mode 0600 on the holder socket", e);
  }
  sock_dev_ = st.st_dev;
  sock_ino_ = st.st_ino;
  if (::listen(fd.get(), SOMAXCONN) != 0) {
    int e = errno;
    ::unlink(path.c_str());
    return ErrnoError(path + ": cannot listen", e);
  }
  int uv_rc = uv_poll_init(loop_, &listen_poll_, fd.get());
  if (uv_rc != 0) {
    ::unlink(path.c_str());
    return IoError(path + ": cannot watch the socket: " + uv_strerror(uv_rc));
  }
  listen_poll_.data = this;
  uv_timer_init(loop_, &resume_timer_);
  resume_timer_.data = this;
  open_server_handles_ = 2;
  started_ = true;
  listen_fd_ = std::move(fd);
  uv_poll_start(&listen_poll_, UV_READABLE, &HolderServer::OnListenEvent);
  if (layouts_ != nullptr) {
    spdlog::info("serving engine-made layouts (backend {}) on {}", layouts_->memory().backend(), path);
    return Status::Ok();
  }
  const Manifest& m = arena_->manifest();
  spdlog::info("serving {} tensors ({} bytes in {} allocations, backend {}) on {}", m.entries.size(),
               m.total_bytes(), m.allocations.size(), m.backend, path);
  return Status::Ok();
}

void HolderServer::Close(std::function<void()> on_closed) {
  if (closing_) return;
  closing_ = true;
  on_closed_ = std::move(on_closed);
  if (started_) {
    uv_close(reinterpret_cast<uv_handle_t*>(&listen_poll_), &HolderServer::OnServerHandleClosed);
    uv_close(reinterpret_cast<uv_handle_t*>(&resume_timer_), &HolderServer::OnServerHandleClosed);
    // Unlink only the socket this server bound, not one a successor bound since.
    struct stat st{};
    if (::lstat(opts_.socket_path.c_str(), &st) == 0 && st.st_dev == sock_dev_ && st.st_ino == sock_ino_) {
      ::unlink(opts_.socket_path.c_str());
    }
  }
  std::vector<Conn*> all;
  for (auto& [id, c] : conns_) all.push_back(c);
  for (Conn* c : all) CloseConn(c);
  MaybeFinishClose();
}

void HolderServer::OnServerHandleClosed(uv_handle_t* h) {
  auto* self = static_cast<HolderServer*>(h->data);
  --self->open_server_handles_;
  self->MaybeFinishClose();
}

void HolderServer::MaybeFinishClose() {
  if (!closing_ || open_server_handles_ > 0 || closing_conns_ > 0 || !conns_.empty()) return;
  if (listen_fd_.valid()) listen_fd_.Reset();
  if (on_closed_) {
    auto cb = std::move(on_closed_);
    on_closed_ = nullptr;
    cb();
  }
}

// ---------------------------------------------------------------- accepting

void HolderServer::OnListenEvent(uv_poll_t* h, int status, int events) {
  auto* self = static_cast<HolderServer*>(h->data);
  if (self->closing_) return;
  if (status < 0) {
    spdlog::error("{}: error on the listening socket: {}", self->opts_.socket_path, uv_strerror(status));
    return;
  }
  self->AcceptAll();
}

void HolderServer::OnResumeAccept(uv_timer_t* t) {
  auto* self = static_cast<HolderServer*>(t->data);
  if (self->closing_) return;
  uv_poll_start(&self->listen_poll_, UV_READABLE, &HolderServer::OnListenEvent);
}

void HolderServer::AcceptAll() {
  for (int i = 0; i < kAcceptsPerEvent; ++i) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      Admit(UniqueFd(fd));
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      // Level-triggered: retrying at once would spin. Pause, then resume.
      spdlog::warn("{}: cannot accept a connection ({}); pausing accepts for {} ms: raise the open-file "
                   "limit (ulimit -n) of the holder",
                   opts_.socket_path, std::strerror(errno), kAcceptPauseMs);
      uv_poll_stop(&listen_poll_);
      uv_timer_start(&resume_timer_, &HolderServer::OnResumeAccept, kAcceptPauseMs, 0);
      return;
    }
    spdlog::error("{}: accept failed: {}", opts_.socket_path, std::strerror(errno));
    return;
  }
}

void HolderServer::Admit(UniqueFd fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    spdlog::warn("{}: cannot read the peer credentials of a new connection ({}); closed it",
                 opts_.socket_path, std::strerror(errno));
    return;
  }
  if (cred.uid != ::geteuid()) {
    spdlog::warn("refused a connection from pid {} uid {}: only uid {} (the holder's user) may use {}",
                 cred.pid, cred.uid, ::geteuid(), opts_.socket_path);
    TellOnce(fd.get(), Refused("uid " + std::to_string(cred.uid) + " may not use this holder; connect as uid " +
                               std::to_string(::geteuid()) + " (the holder's user)"));
    return;
  }
  if (conns_.size() >= opts_.max_connections && !MakeRoom()) {
    const std::string limit = std::to_string(opts_.max_connections);
    spdlog::warn("refused a connection from pid {}: {} connections are open, the limit (--max-connections), "
                 "and every one has a request in flight",
                 cred.pid, conns_.size());
    TellOnce(fd.get(), Unavailable("the holder has " + std::to_string(conns_.size()) +
                                   " connections open, its limit (wsup-holder --max-connections " + limit +
                                   "), and every one has a request in flight; retry in a moment, or raise "
                                   "--max-connections"));
    return;
  }
  int raw = fd.get();
  // A holder of engine-made layouts reads one binary part per request (a
  // commit's tensor table); a checkpoint holder reads none.
  auto* c = new Conn(this, next_id_++, std::move(fd), opts_.max_request_bytes,
                     layouts_ != nullptr ? kMaxBlobBytes : 0);
  c->pid = cred.pid;
  c->uid = cred.uid;
  int rc = uv_poll_init(loop_, &c->poll, raw);
  if (rc != 0) {
    spdlog::error("{}: cannot watch a connection from pid {}: {}; closed it", opts_.socket_path, cred.pid,
                  uv_strerror(rc));
    delete c;
    return;
  }
  uv_timer_init(loop_, &c->timer);
  c->poll.data = c;
  c->timer.data = c;
  c->open_handles = 2;
  conns_[c->id] = c;
  spdlog::debug("accepted a connection from pid {} ({} open)", cred.pid, conns_.size());
  UpdatePoll(c);  // starts the first request's deadline
}

bool HolderServer::MakeRoom() {
  // The connection idle longest; an attached keeper only when no other is
  // idle, since closing its link would read to it as the holder's death.
  Conn* victim = nullptr;
  for (const auto& [id, c] : conns_) {
    if (c->closing || c->in_flight()) continue;
    if (victim == nullptr || (victim->spared && !c->spared) ||
        (victim->spared == c->spared && c->idle_since < victim->idle_since)) {
      victim = c;
    }
  }
  if (victim == nullptr) return false;
  ++evicted_;
  const std::string limit = std::to_string(opts_.max_connections);
  uint64_t idle_ms = uv_now(loop_) - victim->idle_since;
  spdlog::warn("{} connections are open, the limit (--max-connections); closed {}, idle for {} ms, the longest{}, "
               "to admit a new one",
               conns_.size(), Describe(victim), idle_ms,
               victim->spared ? " (a keeper: no other connection was idle)" : "");
  TellOnce(victim->fd.get(),
           Unavailable("the holder closed this connection, idle for " + std::to_string(idle_ms) +
                       " ms, to admit a new one: it had " + limit +
                       " connections open, its limit (--max-connections); connect again to send a request"));
  CloseConn(victim);
  return true;
}

// ---------------------------------------------------------------- per client

std::string HolderServer::Describe(const Conn* c) const {
  if (c->name.empty() && c->role == "pending") {
    return "connection from pid " + std::to_string(c->pid) + " (uid " + std::to_string(c->uid) + ")";
  }
  return "client '" + c->name + "' (" + c->role + ", pid " + std::to_string(c->pid) + ")";
}

void HolderServer::OnConnEvent(uv_poll_t* h, int status, int events) {
  auto* c = static_cast<Conn*>(h->data);
  if (c->closing) return;
  HolderServer* self = c->server;
  if (status < 0) {
    self->Drop(c, std::string("socket error: ") + uv_strerror(status));
    return;
  }
  if (events & UV_WRITABLE) {
    self->Flush(c);
    if (c->closing) return;
  }
  if (events & (UV_READABLE | UV_DISCONNECT)) self->ReadFrom(c);
}

void HolderServer::OnConnTimer(uv_timer_t* t) {
  auto* c = static_cast<Conn*>(t->data);
  if (c->closing) return;
  HolderServer* self = c->server;
  const std::string ms = std::to_string(self->opts_.handshake_timeout_ms);
  switch (c->deadline) {
    case Conn::Deadline::kNone:
      return;
    case Conn::Deadline::kFirstRequest: {
      Error e = Timeout("no complete request within " + ms +
                        " ms of connecting; send 'hello' or 'info' right after connecting");
      self->Drop(c,
                 "sent no complete request within " + ms + " ms (" + std::to_string(c->reader.buffered()) +
                     " bytes received)",
                 &e);
      return;
    }
    case Conn::Deadline::kRequest: {
      Error e = Timeout("a request begun was not complete within " + ms +
                        " ms; send each request whole (length prefix and body) at once");
      self->Drop(c,
                 "sent part of a request (" + std::to_string(c->reader.buffered()) +
                     " bytes) and not the rest within " + ms + " ms",
                 &e);
      return;
    }
    case Conn::Deadline::kReply: {
      size_t left = 0;
      for (const OutgoingFrame& f : c->out) left += f.remaining_bytes();
      self->Drop(c, std::string("did not read its ") + (c->close_after_flush ? "final " : "") + "reply within " +
                        ms + " ms (" + std::to_string(left) + " bytes unsent)");
      return;
    }
    case Conn::Deadline::kIdle: {
      const std::string idle = std::to_string(self->opts_.idle_timeout_ms);
      ++self->closed_idle_;
      spdlog::info("{}: no request for {} ms, its idle limit; closed it{}", self->Describe(c), idle,
                   c->attached ? " (what it mapped stays mapped)" : "");
      TellOnce(c->fd.get(), Timeout("the holder closed this connection after " + idle +
                                    " ms without a request (its idle limit, --idle-timeout-ms); connect "
                                    "again to send another"));
      self->CloseConn(c);
      return;
    }
    case Conn::Deadline::kWait:
      self->WaitExpired(c);
      return;
  }
}

void HolderServer::ReadFrom(Conn* c) {
  for (int i = 0; i < kReadsPerEvent && !c->peer_eof; ++i) {
    // Backpressure: a client with a reply pending is not read from.
    if (!c->out.empty() || c->close_after_flush) break;
    auto state = c->reader.ReadSome(c->fd.get(), 64 << 10);
    if (!state.ok()) {
      Drop(c, "sent a bad message: " + state.error().message(), &state.error());
      return;
    }
    if (*state == FrameReader::ReadState::kWouldBlock) break;
    if (*state == FrameReader::ReadState::kEof) {
      c->peer_eof = true;
      break;
    }
    Flush(c);  // handles the requests now complete
    if (c->closing) return;
  }
  Flush(c);
}

// Sends pending replies, then handles buffered requests one at a time, until
// the socket would block or nothing is left. Iterative on purpose: a client
// may pipeline thousands of tiny requests.
void HolderServer::Flush(Conn* c) {
  for (;;) {
    if (c->closing) return;
    while (!c->out.empty()) {
      size_t before = c->out.front().remaining_bytes();
      auto sent = c->out.front().SendSome(c->fd.get());
      if (!sent.ok()) {
        Drop(c, "cannot send to it: " + sent.error().message());
        return;
      }
      // The client is reading: its reply deadline starts again.
      if (*sent || c->out.front().remaining_bytes() < before) c->restart_deadline = true;
      if (!*sent) break;
      c->out.pop_front();
    }
    if (!c->out.empty()) break;
    if (c->idle_after_flush) {
      c->idle_after_flush = false;
      if (layouts_ != nullptr) layouts_->IdleIfNoWriter();
    }
    if (c->close_after_flush) {
      spdlog::debug("{}: replied, closing", Describe(c));
      CloseConn(c);
      return;
    }
    auto next = c->reader.Next();
    if (!next.ok()) {
      Drop(c, "sent a bad message: " + next.error().message(), &next.error());
      return;
    }
    if (!next->has_value()) {
      if (c->peer_eof) {
        if (c->reader.mid_message()) {
          Drop(c, "disconnected in the middle of a message (" + std::to_string(c->reader.buffered()) +
                      " bytes received" +
                      (c->reader.announced() ? " of " + std::to_string(c->reader.announced() + 4) : "") +
                      ")");
        } else {
          spdlog::debug("{}: disconnected", Describe(c));
          CloseConn(c);
        }
        return;
      }
      break;
    }
    Handle(c, **next);
  }
  UpdatePoll(c);
}

void HolderServer::UpdatePoll(Conn* c) {
  if (c->closing) return;
  int events = 0;
  if (!c->out.empty()) {
    events |= UV_WRITABLE;
  } else if (!c->peer_eof && !c->close_after_flush) {
    events |= UV_READABLE | UV_DISCONNECT;
  }
  if (events != c->poll_events) {
    c->poll_events = events;
    if (events == 0) {
      uv_poll_stop(&c->poll);
    } else {
      int rc = uv_poll_start(&c->poll, events, &HolderServer::OnConnEvent);
      if (rc != 0) {
        Drop(c, std::string("cannot watch its socket: ") + uv_strerror(rc));
        return;
      }
    }
  }
  ArmTimer(c);
}

void HolderServer::ArmTimer(Conn* c) {
  if (c->closing) return;
  using D = Conn::Deadline;
  D want = D::kNone;
  if (!c->out.empty() || c->close_after_flush) {
    want = D::kReply;
  } else if (!c->greeted) {
    want = D::kFirstRequest;
  } else if (c->reader.mid_message()) {
    want = D::kRequest;
  } else if (c->waiting != 0) {
    want = D::kWait;  // the hello's own bound
  } else if (c->lease != 0) {
    want = D::kNone;  // a writer may take as long as its load takes
  } else {
    want = c->spared ? D::kNone : D::kIdle;
  }
  // A deadline that runs is not pushed back by more bytes of the same
  // request: a client trickling a byte at a time still meets it.
  if (want == c->deadline && !c->restart_deadline) return;
  c->restart_deadline = false;
  c->deadline = want;
  if (!c->in_flight()) c->idle_since = uv_now(loop_);
  if (want == D::kNone) {
    uv_timer_stop(&c->timer);
    return;
  }
  uint64_t ms = want == D::kIdle   ? static_cast<uint64_t>(opts_.idle_timeout_ms)
                : want == D::kWait ? c->wait_ms
                                   : static_cast<uint64_t>(opts_.handshake_timeout_ms);
  uv_timer_start(&c->timer, &HolderServer::OnConnTimer, ms, 0);
}

void HolderServer::Reply(Conn* c, json msg, std::vector<UniqueFd> fds,
                         std::shared_ptr<const std::string> blob) {
  auto frame = OutgoingFrame::Make(std::move(msg), std::move(fds), kMaxMessageBytes, std::move(blob));
  if (!frame.ok()) {
    spdlog::error("{}: cannot build a reply: {}", Describe(c), frame.error().message());
    TellOnce(c->fd.get(), frame.error());
    CloseConn(c);
    return;
  }
  c->out.push_back(std::move(frame).value());
}

void HolderServer::Drop(Conn* c, const std::string& why, const Error* tell) {
  if (c->closing) return;
  spdlog::warn("{}: {}; dropped it", Describe(c), why);
  // Only between frames: half a reply followed by an error would be garbage.
  if (tell != nullptr && c->out.empty()) TellOnce(c->fd.get(), *tell);
  CloseConn(c);
}

void HolderServer::CloseConn(Conn* c) {
  if (c->closing) return;
  c->closing = true;
  if (layouts_ != nullptr) {
    LayoutConnGone(c);
    if (c->idle_after_flush) layouts_->IdleIfNoWriter();
  }
  conns_.erase(c->id);
  ++closing_conns_;
  uv_close(reinterpret_cast<uv_handle_t*>(&c->poll), &HolderServer::OnConnHandleClosed);
  uv_close(reinterpret_cast<uv_handle_t*>(&c->timer), &HolderServer::OnConnHandleClosed);
}

void HolderServer::OnConnHandleClosed(uv_handle_t* h) {
  auto* c = static_cast<Conn*>(h->data);
  if (--c->open_handles > 0) return;
  HolderServer* self = c->server;
  delete c;  // closes the socket
  --self->closing_conns_;
  self->MaybeFinishClose();
}

}  // namespace wsup
