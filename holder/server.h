// HolderServer: the holder's side of the holder protocol (wire/protocol.h).
// It hands the arena's fds and manifest to clients whose fingerprint
// matches, answers `info`, and keeps track of who is attached.
//
// Security: the socket lives in a directory of mode 0700 (created when
// missing; an existing directory that other users can enter is refused) and
// is itself mode 0600; on top of that every connection's peer uid
// (SO_PEERCRED) must equal the holder's, so a misconfigured directory still
// does not hand weights to another user. Refusals are logged with the
// peer's pid and uid.
//
// Robustness: one libuv loop, one thread, every client socket non-blocking
// with its own buffers, so a slow or hostile client never blocks another.
// Requests are bounded in size (the length prefix is checked before the
// body is buffered), and a client that sends garbage, an oversized prefix,
// or disconnects in the middle of a message is dropped with a log line while
// the server keeps serving. A client with an unread reply is not read from
// (backpressure).
//
// Limits (ServerOptions; wsup-holder flags in brackets). Every connection is
// in one of four states, each with its own clock:
//   - no request yet: the first complete request must arrive within
//     handshake_timeout_ms of connecting [--handshake-timeout-ms, 10 s];
//   - part of a request received: the rest must follow within
//     handshake_timeout_ms of its first byte;
//   - a reply being sent: the client must take some of it within
//     handshake_timeout_ms, or it is dropped;
//   - idle (nothing in flight): closed after idle_timeout_ms without a
//     request [--idle-timeout-ms, 60 s], after every request, not only before
//     the first. The client is told why in an error frame.
// At most max_connections are open [--max-connections, 1000]. A newcomer
// past the limit is never refused while some connection is idle: the one
// idle longest is closed to make room (logged as a warning, counted in
// `info` as evicted). Only when every connection has a request in flight is
// the newcomer refused, with an error that names the limit and the flag.
//
// Which connections the idle limit spares: an attached client keeps its
// mapping without the connection (the fds it received, client/mapping.h),
// so engines and inspectors lose nothing when the holder closes theirs; the
// connection only let `info` count them. The supervisor's fd keeper is
// different: its open connection is its link to the holder, and by the
// keeper's contract (client/client.h KeptArena) that link's EOF means the
// holder died; closing it on a timer would read as a holder death. So an
// attached keeper has no idle limit, and it is evicted at the connection
// limit only when no other connection is idle (logged as a warning). A
// keepalive request would have done too, but it would make every keeper
// poll the holder for nothing and turn a missed poll into a false death.
// The role is declared in the keeper's hello; since a spared keeper still
// yields when nothing else is idle, a client that claims the role cannot
// lock anyone out. A connection that has not attached (an `info` asker, a
// refused hello) is never spared.
//
// Engine-made layouts (a holder started with --layout engine; the second
// constructor): there is no arena, only a LayoutStore (holder/layout_store.h)
// that keeps one layout per fingerprint. An engine's hello gets the
// committed layout (attach), or a write lease when nobody has one (the
// connection then may alloc, commit and abort, and has no idle limit while
// it holds the lease), or waits for another writer's commit for the
// hello's wait_ms (its timer; a waiting connection is never evicted, and a
// request from it while it waits is a protocol error). When a writer's
// connection closes before its commit, the layout is released and the
// waiter that came first (of those that offered to publish) gets a new
// lease; the others keep waiting. The protocol is wire/layout_protocol.h.
// Connections of such a holder may send one binary part (a commit's tensor
// table, up to kMaxBlobBytes); any other message with one is refused. The
// supervisor's keeper (hello role keeper) is told every committed layout
// and asks for each one's record and fds with `keep` (one layout per
// reply); its connection is short-lived and has the usual idle limit. The
// layouts a restarted holder adopts (--adopt-layouts) are committed from
// its start. Grants past --layout-max-bytes are refused (LayoutStore).
//
// The KV pool (--kv-pool-mib, --adopt-kv-pool; wire/kv_pool.h): any
// connection may ask for it with `kv_pool`, without a hello, and gets its
// description and a dup of every fd; a holder without one answers an error
// (not_found) that names the flag. The connection stays open like an
// `info` asker's, with the usual idle limit.
//
// Attach replies: Start() encodes the arena's binary tensor table once; every
// client that asks for it (hello's tensor_table) gets that one buffer, shared,
// beside a small JSON reply, so an attach costs the holder no per-tensor
// work. Other clients get the manifest as JSON.
//
// Ownership: the server owns the listening socket, every connection and
// their libuv handles (uv_poll_t for sockets, uv_timer_t for deadlines); each
// connection is freed in the close callback of its last handle. The arena is
// borrowed and must outlive the server. Close() starts closing everything;
// the loop then runs until the close callbacks have fired, and only after
// that may the server be destroyed. Loop thread only.
#pragma once

#include <sys/types.h>
#include <uv.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "checkpoint/fingerprint.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "holder/arena.h"
#include "holder/kv_pool.h"
#include "holder/layout_store.h"
#include "wire/protocol.h"

namespace wsup {

struct ServerOptions {
  std::string socket_path;
  // Time a new connection has to send its first complete request, a client
  // has to finish a request it began, and a client has to take some of a
  // reply before it is dropped.
  int handshake_timeout_ms = 10'000;
  // A connection with no request in flight for this long is closed (an
  // attached keeper excepted; see the top of this file).
  int idle_timeout_ms = 60'000;
  // Requests (hello, info, bye) are small; replies may be up to kMaxMessageBytes.
  uint32_t max_request_bytes = 1u << 20;
  // Open connections at most; past it the longest-idle one makes room.
  size_t max_connections = 1000;
  // Shown by `info`.
  std::string deployment;
  std::string revision;
  bool adopted = false;
};

// Makes sure the socket's directory exists with mode 0700 and belongs to this
// user, and that no other holder serves on the path (a stale socket file
// from a dead holder is removed). Errors name the path and the fix.
Status PrepareSocketPath(const std::string& socket_path);

class HolderServer {
 public:
  HolderServer(uv_loop_t* loop, const Arena& arena, Fingerprint fingerprint, ServerOptions opts);
  // A holder of engine-made layouts: `fingerprint` is the holder's own
  // (layout "engine", its backend and device), shown by `info`. The store
  // is borrowed and must outlive the server.
  HolderServer(uv_loop_t* loop, LayoutStore* layouts, Fingerprint fingerprint, ServerOptions opts);
  ~HolderServer();
  HolderServer(const HolderServer&) = delete;
  HolderServer& operator=(const HolderServer&) = delete;

  // Prepares the path, binds (mode 0600), listens and starts accepting.
  Status Start();
  // Stops accepting, drops every client, unlinks the socket, and closes
  // every handle; on_closed runs on the loop once the last close callback
  // has fired (the server may be destroyed from then on).
  void Close(std::function<void()> on_closed = nullptr);

  // The node's KV pool (holder/kv_pool.h), served to any connection that
  // asks (`kv_pool`, no hello needed, like `info`); borrowed, it must
  // outlive the server. Without one, `kv_pool` is answered not_found.
  void ServeKvPool(const KvPool* pool) { kv_pool_ = pool; }

  InfoMsg Info() const;
  size_t connections() const { return conns_.size(); }
  // Connections closed for their idle limit, and to make room at the limit.
  uint64_t closed_idle() const { return closed_idle_; }
  uint64_t evicted() const { return evicted_; }
  const std::string& socket_path() const { return opts_.socket_path; }

 private:
  struct Conn;
  static void OnListenEvent(uv_poll_t* h, int status, int events);
  static void OnConnEvent(uv_poll_t* h, int status, int events);
  static void OnConnTimer(uv_timer_t* t);
  static void OnConnHandleClosed(uv_handle_t* h);
  static void OnServerHandleClosed(uv_handle_t* h);
  static void OnResumeAccept(uv_timer_t* t);

  void AcceptAll();
  void Admit(UniqueFd fd);
  void ReadFrom(Conn* c);
  // Requests (server_requests.cc).
  void Handle(Conn* c, const Frame& frame);
  void HandleHello(Conn* c, const Frame& frame);
  void HandleKvPool(Conn* c);
  // Engine-made layouts (server_layouts.cc).
  void HandleLayoutHello(Conn* c, const HelloMsg& hello);
  void HandleLayoutRequest(Conn* c, const std::string& type, const Frame& frame);
  void HandleAlloc(Conn* c, Layout* l, const Frame& frame);
  void HandleCommit(Conn* c, Layout* l, const Frame& frame);
  void HandleAbort(Conn* c, Layout* l, const Frame& frame);
  // The supervisor's keeper asks for a committed layout's record and fds.
  void HandleKeep(Conn* c, const Frame& frame);
  void GrantLease(Conn* c, const Fingerprint& fp);
  void ReplyLayoutAttach(Conn* c, Layout* l);
  // After a commit: every waiter gets the layout.
  void ServeWaiters(Layout* l);
  // After a release: the first waiter that offered to publish gets a new
  // lease, the rest wait for it; with none, every waiter is told why.
  void PassLease(const Fingerprint& fp, std::deque<uint64_t> waiters, const std::string& why);
  // A waiter whose wait_ms passed.
  void WaitExpired(Conn* c);
  // Called as a connection closes: a writer loses its lease, a waiter
  // leaves its queue.
  void LayoutConnGone(Conn* c);
  // Replies an error and closes the connection once it is sent.
  void RefuseAndClose(Conn* c, const Error& e);
  void Reply(Conn* c, nlohmann::json msg, std::vector<UniqueFd> fds = {},
             std::shared_ptr<const std::string> blob = nullptr);
  void Flush(Conn* c);
  void UpdatePoll(Conn* c);
  // Starts the one timer that fits the connection's state (see "Limits"
  // above), unless that deadline already runs; Handle() and progress on a
  // reply restart it. Called after every change of state.
  void ArmTimer(Conn* c);
  // At the connection limit: closes the connection idle longest (an attached
  // keeper only when nothing else is idle). False when every one is busy.
  bool MakeRoom();
  // Logs why, tries once to tell the client, and closes it.
  void Drop(Conn* c, const std::string& why, const Error* tell = nullptr);
  void CloseConn(Conn* c);
  void MaybeFinishClose();
  std::string Describe(const Conn* c) const;

  uv_loop_t* loop_;
  const Arena* arena_ = nullptr;     // a checkpoint holder's
  LayoutStore* layouts_ = nullptr;   // a holder of engine-made layouts
  const KvPool* kv_pool_ = nullptr;  // the node's KV pool, when this holder made or adopted one
  Fingerprint fingerprint_;
  // Built once by Start(): the arena's tensor table, shared by every attach
  // reply that carries it, and the manifest header that announces it.
  std::shared_ptr<const std::string> table_;
  nlohmann::json table_manifest_;
  ServerOptions opts_;
  UniqueFd listen_fd_;
  dev_t sock_dev_ = 0;
  ino_t sock_ino_ = 0;
  uv_poll_t listen_poll_{};
  uv_timer_t resume_timer_{};
  bool started_ = false;
  bool closing_ = false;
  int open_server_handles_ = 0;
  size_t closing_conns_ = 0;
  std::function<void()> on_closed_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Conn*> conns_;
  uint64_t attaches_ = 0;
  uint64_t closed_idle_ = 0;
  uint64_t evicted_ = 0;
};

}  // namespace wsup
