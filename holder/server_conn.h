// HolderServer::Conn: one client connection of the holder server, shared by
// the files that implement the server (server.cc: sockets, limits and
// connections; server_requests.cc: the requests, and the checkpoint arena's
// hello; server_layouts.cc: engine-made layouts). Private to holder/. Loop
// thread only.
#pragma once

#include <sys/types.h>
#include <uv.h>

#include <cstdint>
#include <deque>
#include <string>

#include "common/unique_fd.h"
#include "holder/server.h"
#include "wire/protocol.h"

namespace wsup {

struct HolderServer::Conn {
  // What the connection's timer runs for (server.h, "Limits").
  enum class Deadline { kNone, kFirstRequest, kRequest, kReply, kIdle, kWait };

  Conn(HolderServer* s, uint64_t i, UniqueFd f, uint32_t max_request, uint32_t max_blob)
      : server(s), id(i), fd(std::move(f)), reader(max_request, /*accept_fds=*/false, max_blob) {}

  HolderServer* server;
  uint64_t id;
  UniqueFd fd;
  uv_poll_t poll{};
  uv_timer_t timer{};
  int open_handles = 0;
  int poll_events = -1;  // what the poll watches now; -1: not started
  FrameReader reader;
  std::deque<OutgoingFrame> out;
  pid_t pid = 0;
  uid_t uid = 0;
  std::string name;
  std::string role = "pending";
  bool greeted = false;   // its first request was handled
  bool attached = false;  // it received the fds
  bool spared = false;    // an attached keeper: no idle limit (server.h)
  Deadline deadline = Deadline::kNone;
  bool restart_deadline = false;  // a request was handled or a reply moved on
  uint64_t idle_since = 0;        // uv_now() when it last had nothing in flight
  bool close_after_flush = false;
  bool idle_after_flush = false;  // a commit's reply: let the writers' device context go once it is sent
  bool peer_eof = false;
  bool closing = false;
  // Engine-made layouts: the layout this connection writes (its lease), or
  // waits for; 0 for none. A waiter's bound and whether it offered to
  // publish; whether attach replies carry the binary tensor table.
  uint64_t lease = 0;
  uint64_t waiting = 0;
  uint64_t wait_ms = 0;
  bool publish = false;
  bool wants_table = false;
  bool keeper = false;  // said hello as the supervisor's keeper: may send `keep`

  // A request is in flight from its first byte until its reply has been sent
  // (a waiter's hello until the layout it waits for is answered); a writer
  // holding a lease is never idle.
  bool in_flight() const {
    return !out.empty() || close_after_flush || reader.mid_message() || lease != 0 || waiting != 0;
  }
};

}  // namespace wsup
