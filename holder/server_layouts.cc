// HolderServer's engine-made layouts (holder/server.h, "Engine-made
// layouts"; the protocol is wire/layout_protocol.h): leases, grants,
// commits, aborts, waiters, and what a writer's disconnection does.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "holder/server.h"
#include "holder/server_conn.h"

namespace wsup {

using nlohmann::json;

void HolderServer::RefuseAndClose(Conn* c, const Error& e) {
  Reply(c, EncodeError(e));
  if (c->closing) return;
  c->close_after_flush = true;  // the reply deadline bounds how long it may stay unread
}

void HolderServer::HandleLayoutHello(Conn* c, const HelloMsg& hello) {
  if (hello.role == ClientRole::kKeeper) {
    // The supervisor's keeper: told every committed layout, it asks for the
    // ones it does not keep yet, one `keep` each.
    CommittedMsg m;
    m.layouts = layouts_->Committed();
    c->keeper = true;
    spdlog::info("{}: a keeper; {} committed layouts to keep", Describe(c), m.layouts.size());
    Reply(c, EncodeCommitted(m));
    return;
  }
  if (hello.role != ClientRole::kEngine) {
    Error e = Refused(std::string("this holder keeps engine-made layouts (--layout engine); a ") +
                      ClientRoleName(hello.role) +
                      " cannot attach them as a whole in this version: use 'wsup cache info' to see them, and "
                      "let engines attach their own layout");
    spdlog::info("{}: {}", Describe(c), e.message());
    RefuseAndClose(c, e);
    return;
  }
  if (!hello.fingerprint) {
    RefuseAndClose(c, InvalidArgument("an engine must present the fingerprint of the layout it computes from: "
                                      "its checkpoint's (Fingerprint::Compute) with its own engine fields "
                                      "(AddEngineLayout)"));
    return;
  }
  const Fingerprint& fp = *hello.fingerprint;
  if (!IsEngineLayout(fp)) {
    Error e = InvalidArgument(
        "this holder keeps engine-made layouts (--layout engine) and the client's fingerprint names none "
        "(no field layout = engine); start the engine with --layout engine, or attach to a holder started "
        "with --model");
    spdlog::info("{}: {}", Describe(c), e.message());
    RefuseAndClose(c, e);
    return;
  }
  // A layout lives where this holder keeps layouts: a client that computes
  // on another backend could neither write nor map it.
  const std::string backend = fp.Get("backend");
  const std::string ours = layouts_->memory().backend();
  if (!backend.empty() && backend != ours) {
    Error e = Mismatch("the client's fingerprint names backend " + backend.substr(0, 32) +
                       " but this holder keeps engine-made layouts in " + (ours == "cuda" ? "cuda device" : "host") +
                       " memory (--backend " + ours + "); start the engine with backend " + ours +
                       ", or publish into a holder started with --backend " + backend.substr(0, 32));
    spdlog::info("{}: {}", Describe(c), e.message());
    RefuseAndClose(c, e);
    return;
  }
  c->publish = hello.publish;
  c->wait_ms = hello.wait_ms;
  c->wants_table = hello.tensor_table >= kTensorTableVersion;
  Layout* l = layouts_->Find(fp);
  if (l == nullptr) {
    if (!hello.publish) {
      Error e = NotFound("no layout is committed for this fingerprint on this holder, and the client did not "
                         "offer to publish one (hello publish: true); start the engine with --layout engine "
                         "to publish its layout");
      spdlog::info("{}: {}", Describe(c), e.message());
      RefuseAndClose(c, e);
      return;
    }
    GrantLease(c, fp);
    return;
  }
  if (l->state == LayoutState::kCommitted) {
    ReplyLayoutAttach(c, l);
    return;
  }
  // Being written by another client.
  const uint64_t held_ms = uv_now(loop_) - l->began_ms;
  if (hello.wait_ms == 0) {
    RefuseAndClose(c, Unavailable("layout " + std::to_string(l->id) + " is being written by '" + l->writer_name +
                                  "' (pid " + std::to_string(l->writer_pid) + ", for " + std::to_string(held_ms) +
                                  " ms); ask with wait_ms to wait for its commit instead of loading a copy"));
    return;
  }
  c->waiting = l->id;
  l->waiters.push_back(c->id);
  spdlog::info("{}: waits up to {} ms for layout {}, which '{}' (pid {}) has been writing for {} ms", Describe(c),
               hello.wait_ms, l->id, l->writer_name, l->writer_pid, held_ms);
}

void HolderServer::GrantLease(Conn* c, const Fingerprint& fp) {
  auto l = layouts_->Begin(fp, c->id, c->name, c->pid, uv_now(loop_));
  if (!l.ok()) {
    RefuseAndClose(c, l.error());
    return;
  }
  c->lease = (*l)->id;
  c->waiting = 0;
  Reply(c, EncodeLease(layouts_->Lease(**l)));
}

void HolderServer::ReplyLayoutAttach(Conn* c, Layout* l) {
  std::vector<UniqueFd> fds;
  for (size_t i = 0; i < l->fds.size(); ++i) {
    auto d = l->fds[i].Dup();
    if (!d.ok()) {
      spdlog::error("{}: cannot duplicate layout {}'s fds: {}", Describe(c), l->id, d.error().message());
      RefuseAndClose(c, d.error());
      return;
    }
    fds.push_back(std::move(d).value());
  }
  if (c->wants_table) {
    Reply(c, EncodeLayoutAttach(l->table_manifest, l->fingerprint, l->id, l->layout_hash), std::move(fds), l->table);
  } else {
    Reply(c, EncodeLayoutAttach(l->json_manifest, l->fingerprint, l->id, l->layout_hash), std::move(fds));
  }
  if (c->closing) return;
  c->attached = true;
  c->waiting = 0;
  ++l->attaches;
  ++attaches_;
  spdlog::info("attached {} to layout {}: {} allocations, {} tensors", Describe(c), l->id, l->fds.size(),
               l->manifest.entries.size());
}

void HolderServer::HandleLayoutRequest(Conn* c, const std::string& type, const Frame& frame) {
  Layout* l = c->lease != 0 ? layouts_->Get(c->lease) : nullptr;
  if (l == nullptr || l->state != LayoutState::kWriting || l->writer != c->id) {
    Error e = Refused("'" + type + "' from a client that holds no write lease on this connection; send 'hello' "
                      "with publish: true first, and '" + type + "' on the connection that got the lease");
    spdlog::warn("{}: {}", Describe(c), e.message());
    RefuseAndClose(c, e);
    return;
  }
  if (type == "alloc") {
    HandleAlloc(c, l, frame);
  } else if (type == "commit") {
    HandleCommit(c, l, frame);
  } else {
    HandleAbort(c, l, frame);
  }
}

void HolderServer::HandleKeep(Conn* c, const Frame& frame) {
  if (!c->keeper) {
    Error e = Refused("'keep' from a client that is not a keeper; only the supervisor's keeper (hello role "
                      "keeper) takes committed layouts' fds");
    spdlog::warn("{}: {}", Describe(c), e.message());
    RefuseAndClose(c, e);
    return;
  }
  auto req = DecodeKeep(frame.msg);
  if (!req.ok()) {
    Reply(c, EncodeError(req.error()));
    return;
  }
  Layout* l = layouts_->Get(req->layout);
  if (l == nullptr || l->state != LayoutState::kCommitted) {
    Reply(c, EncodeError(NotFound("layout " + std::to_string(req->layout) +
                                  " is not committed on this holder (never, or it is still being written); "
                                  "ask for a layout that 'committed' lists")));
    return;
  }
  std::vector<UniqueFd> fds;
  for (const UniqueFd& f : l->fds) {
    auto d = f.Dup();
    if (!d.ok()) {
      // Out of fds for a moment: the keeper asks again at the next commit.
      spdlog::error("{}: cannot duplicate layout {}'s fds for the keeper: {}", Describe(c), l->id,
                    d.error().message());
      Reply(c, EncodeError(d.error()));
      return;
    }
    fds.push_back(std::move(d).value());
  }
  Reply(c, EncodeKept(LayoutStore::Record(*l)), std::move(fds));
  spdlog::info("{}: kept layout {} ({} allocations)", Describe(c), l->id, l->fds.size());
}

void HolderServer::HandleAlloc(Conn* c, Layout* l, const Frame& frame) {
  auto req = DecodeAlloc(frame.msg);
  if (!req.ok()) {
    Reply(c, EncodeError(req.error()));
    return;
  }
  auto grant = layouts_->Allocate(l, req->bytes);
  if (!grant.ok()) {
    spdlog::warn("{}: layout {}: {}", Describe(c), l->id, grant.error().message());
    Reply(c, EncodeError(grant.error()));
    return;
  }
  std::vector<UniqueFd> fds;
  fds.push_back(std::move(grant->fd));
  Reply(c, EncodeGrant(grant->msg), std::move(fds));
}

void HolderServer::HandleCommit(Conn* c, Layout* l, const Frame& frame) {
  auto commit = DecodeCommit(frame.msg, frame.blob);
  if (!commit.ok()) {
    spdlog::warn("{}: layout {}: a bad commit: {}", Describe(c), l->id, commit.error().message());
    Reply(c, EncodeError(commit.error().With("commit refused")));
    return;
  }
  Status st = layouts_->Commit(l, std::move(commit->manifest), commit->layout_hash);
  if (!st.ok()) {
    Reply(c, EncodeError(st.error()));
    return;
  }
  c->lease = 0;
  // The writer waits for this reply; the context goes after it is sent
  // (Flush), or when the connection closes first (CloseConn).
  c->idle_after_flush = true;
  ReplyLayoutAttach(c, l);
  ServeWaiters(l);
}

void HolderServer::HandleAbort(Conn* c, Layout* l, const Frame& frame) {
  auto req = DecodeAbort(frame.msg);
  std::string why = req.ok() && !req->reason.empty() ? req->reason : "no reason given";
  const uint64_t id = l->id;
  const Fingerprint fp = l->fingerprint;
  c->lease = 0;
  auto waiters = layouts_->Release(l, LayoutEvent::kAbort, "'" + c->name + "' aborted: " + why);
  Reply(c, EncodeAborted(AbortedMsg{id}));
  PassLease(fp, std::move(waiters), "the writer aborted (" + why + ")");
}

void HolderServer::ServeWaiters(Layout* l) {
  std::deque<uint64_t> waiters = std::move(l->waiters);
  l->waiters.clear();
  for (uint64_t id : waiters) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    Conn* w = it->second;
    if (w->closing || w->waiting != l->id) continue;
    ReplyLayoutAttach(w, l);
    UpdatePoll(w);  // the loop sends the reply
  }
}

void HolderServer::PassLease(const Fingerprint& fp, std::deque<uint64_t> waiters, const std::string& why) {
  if (closing_) return;
  std::vector<Conn*> live;
  for (uint64_t id : waiters) {
    auto it = conns_.find(id);
    if (it != conns_.end() && !it->second->closing && it->second->waiting != 0) live.push_back(it->second);
  }
  Conn* next = nullptr;
  for (Conn* w : live) {
    if (w->publish) {
      next = w;
      break;
    }
  }
  if (next == nullptr) {
    for (Conn* w : live) {
      w->waiting = 0;
      RefuseAndClose(w, NotFound("the layout this client waited for was released (" + why +
                                 ") and no waiting client offered to publish it; start an engine with "
                                 "--layout engine to publish it, or load from disk"));
      UpdatePoll(w);
    }
    return;
  }
  spdlog::info("{}: the layout was released ({}); it gets the lease, {} others keep waiting", Describe(next), why,
               live.size() - 1);
  GrantLease(next, fp);
  UpdatePoll(next);
  Layout* l = next->lease != 0 ? layouts_->Get(next->lease) : nullptr;
  for (Conn* w : live) {
    if (w == next) continue;
    if (l == nullptr) {
      w->waiting = 0;
      RefuseAndClose(w, Unavailable("the layout this client waited for was released (" + why +
                                    ") and could not be leased again; check the holder's log"));
      UpdatePoll(w);
      continue;
    }
    w->waiting = l->id;
    l->waiters.push_back(w->id);
  }
}

void HolderServer::WaitExpired(Conn* c) {
  Layout* l = layouts_->Get(c->waiting);
  std::string writer = "its writer";
  if (l != nullptr) {
    writer = "'" + l->writer_name + "' (pid " + std::to_string(l->writer_pid) + "), writing it for " +
             std::to_string(uv_now(loop_) - l->began_ms) + " ms,";
    std::erase(l->waiters, c->id);
  }
  Error e = Timeout("no layout was committed within the " + std::to_string(c->wait_ms) +
                    " ms this client waits (hello wait_ms): " + writer +
                    " has not committed; raise the wait bound, or load from disk");
  spdlog::warn("{}: {}", Describe(c), e.message());
  c->waiting = 0;
  RefuseAndClose(c, e);
  Flush(c);
}

void HolderServer::LayoutConnGone(Conn* c) {
  if (c->waiting != 0) {
    if (Layout* l = layouts_->Get(c->waiting)) std::erase(l->waiters, c->id);
    c->waiting = 0;
  }
  if (c->lease == 0) return;
  Layout* l = layouts_->Get(c->lease);
  c->lease = 0;
  if (l == nullptr || l->state != LayoutState::kWriting) return;
  const Fingerprint fp = l->fingerprint;
  const std::string why = "writer '" + c->name + "' (pid " + std::to_string(c->pid) +
                          ") disconnected before its commit";
  auto waiters = layouts_->Release(l, LayoutEvent::kWriterLost, why + "; its memory is released");
  PassLease(fp, std::move(waiters), why);
}

}  // namespace wsup
