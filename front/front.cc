#include "front/front.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/clock.h"
#include "common/cpus.h"
#include "common/log.h"
#include "common/signals.h"
#include "front/control_socket.h"
#include "front/status_merge.h"

namespace wsup::front {

namespace {

// An optional "HOST:PORT" field of a control message (`type`): a string,
// null, or (when not required) absent.
Result<std::optional<HostPort>> RouteField(const nlohmann::json& msg, const char* key, bool required,
                                           const std::string& type = "set_routes") {
  auto it = msg.find(key);
  if (it == msg.end()) {
    if (required) {
      return InvalidArgument(type + ": field '" + key + "' is missing; send \"HOST:PORT\"" +
                             (type == "set_routes" ? " or null (no route)" : ""));
    }
    return std::optional<HostPort>();
  }
  if (it->is_null()) return std::optional<HostPort>();
  if (!it->is_string()) {
    return InvalidArgument(type + ": field '" + key + "' is " + it->type_name() + "; send \"HOST:PORT\"" +
                           (type == "set_routes" ? " or null" : ""));
  }
  auto hp = ParseHostPort(it->get_ref<const std::string&>(), type + "." + key);
  if (!hp.ok()) return hp.error();
  return std::optional<HostPort>(std::move(hp).value());
}

}  // namespace

// What a set of loops answers: one entry per worker, filled on the main loop.
struct Front::Gather {
  std::vector<nlohmann::json> parts;
  size_t left = 0;
  std::function<void(std::vector<nlohmann::json>)> done;
  void Put(size_t i, nlohmann::json j) {
    parts[i] = std::move(j);
    if (--left == 0 && done) done(std::move(parts));
  }
};

Front::Front(uv_loop_t* loop, FrontOptions options)
    : loop_(loop),
      options_(std::move(options)),
      mailbox_(loop),
      acceptor_(loop, [this](int fd) { OnSocket(fd); }) {
  hedge_.after_ms = options_.proxy.hedge_after_ms;
  hedge_.percent = options_.proxy.hedge_percent;
  hedge_.burst = options_.proxy.hedge_burst;
  open_parts_ = 2;  // the mailbox and the acceptor
}

Front::~Front() {
  if (open_parts_ != 0) spdlog::error("front: destroyed while open; call Stop() and run the loop until done");
}

int ResolveLoops(int loops) {
  if (loops > 0) return loops;
  return std::clamp(UsableCpus(), 1, kMaxLoops);
}

Status Front::Start() {
  if (started_ || close_.closing()) return Internal("front: Start() called twice or after Stop()");
  started_ = true;
  // Routes first: a bad flag should fail before the socket is taken.
  if (!options_.active.empty()) {
    WSUP_ASSIGN_OR_RETURN(HostPort a, ParseHostPort(options_.active, "--active"));
    active_ = std::move(a);
  }
  if (!options_.standby.empty()) {
    WSUP_ASSIGN_OR_RETURN(HostPort s, ParseHostPort(options_.standby, "--standby"));
    standby_ = std::move(s);
  }
  if (standby_ && !active_) {
    return InvalidArgument(
        "--standby is given without --active; pass --active too (the standby only takes over "
        "from an active engine)");
  }
  if (active_ && standby_ && active_->ToString() == standby_->ToString()) {
    return InvalidArgument("--active and --standby are both " + active_->ToString() +
                           "; route two different engines");
  }
  epoch_ = options_.epoch;
  first_ok_pending_ = active_ ? active_->ToString() : "";

  if (options_.listen_fd < 0) {
    WSUP_ASSIGN_OR_RETURN(HostPort l, ParseHostPort(options_.listen, "--listen", /*allow_port_zero=*/true));
    WSUP_RETURN_IF_ERROR(acceptor_.Listen(l.host, l.port, options_.server.backlog));
    l.port = acceptor_.port();
    listen_address_ = l.ToString();
  } else {
    auto name = SocketName(options_.listen_fd);
    if (!name.ok()) return name.error().With("--listen-fd " + std::to_string(options_.listen_fd));
    Status st = acceptor_.Adopt(options_.listen_fd, options_.server.backlog);
    if (!st.ok()) return st.error().With("--listen-fd " + std::to_string(options_.listen_fd));
    listen_address_ = name->ToString();
  }

  const int n = ResolveLoops(options_.loops);
  http::ServerOptions so = options_.server;
  so.max_connections = std::max<size_t>(1, (so.max_connections + n - 1) / n);  // dealt in turn: an even share
  for (int i = 0; i < n; ++i) {
    ProxyOptions po = options_.proxy;
    po.log_routes = i == 0;  // one line per route change, not one per loop
    // Every client connection of this loop may have a request on its own
    // engine connection: keeping fewer idle closes and reopens one per
    // request above that (at 256 clients on 2 loops, a third of requests
    // paid a connect and a close).
    po.upstream.max_idle_per_backend = std::max(po.upstream.max_idle_per_backend, so.max_connections);
    auto w = std::make_unique<Worker>(i, so, po, &shared_, [this, i](const nlohmann::json& event) {
      mailbox_.Post([this, i, event] { OnWorkerEvent(i, event); });
    });
    // Before its thread runs, the worker's loop is this thread's to touch.
    WSUP_RETURN_IF_ERROR(w->proxy().SetRoutes(active_, standby_, epoch_));
    w->Start();
    workers_.push_back(std::move(w));
  }

  if (!options_.control.empty()) {
    control_ = std::make_unique<JsonServer>(
        loop_, options_.control,
        [this](const std::shared_ptr<JsonConn>& c, const nlohmann::json& m) { OnControlMessage(c, m); },
        ControlSocketOptions());
    ++open_parts_;
    WSUP_RETURN_IF_ERROR(control_->Listen());
  }

  std::string line = "listening on " + listen_address_ + "\n";
  std::fputs(line.c_str(), stdout);
  std::fflush(stdout);
  if (options_.ready_fd >= 0) {
    ssize_t w = ::write(options_.ready_fd, line.data(), line.size());
    if (w != static_cast<ssize_t>(line.size())) {
      spdlog::warn("front: could not write the ready line to --ready-fd {}: {}", options_.ready_fd,
                   w < 0 ? std::strerror(errno) : "short write");
    }
    ::close(options_.ready_fd);
    options_.ready_fd = -1;
  }
  spdlog::info("front: listening on {} with {} loops, control {}, active {}, standby {}, epoch {}",
               listen_address_, n, options_.control.empty() ? "none" : options_.control,
               active_ ? active_->ToString() : "none", standby_ ? standby_->ToString() : "none", epoch_);
  return Status::Ok();
}

void Front::OnSocket(int fd) {
  if (workers_.empty() || close_.closing()) {
    ::close(fd);
    return;
  }
  Worker& w = *workers_[next_worker_];
  next_worker_ = (next_worker_ + 1) % workers_.size();
  w.TakeConnection(fd);
}

void Front::AskWorkers(const std::function<nlohmann::json(Worker&)>& ask,
                       std::function<void(std::vector<nlohmann::json>)> done) {
  auto g = std::make_shared<Gather>();
  g->parts.resize(workers_.size());
  g->left = workers_.size() + 1;  // +1: held until every question is posted
  g->done = std::move(done);
  for (size_t i = 0; i < workers_.size(); ++i) {
    bool posted = workers_[i]->Post([this, g, i, ask](Worker& w) {
      nlohmann::json answer = ask(w);
      mailbox_.Post([g, i, answer = std::move(answer)]() mutable { g->Put(i, std::move(answer)); });
    });
    if (!posted) g->Put(i, nullptr);
  }
  if (--g->left == 0 && g->done) g->done(std::move(g->parts));
}

void Front::OnControlMessage(const std::shared_ptr<JsonConn>& c, const nlohmann::json& m) {
  auto slot = std::make_shared<std::optional<nlohmann::json>>();
  replies_[c].push_back(slot);
  std::weak_ptr<JsonConn> weak = c;
  Reply reply = [this, slot, weak](nlohmann::json r) {
    *slot = std::move(r);
    if (auto conn = weak.lock()) FlushReplies(conn);
  };
  try {
    HandleControl(m, reply);
  } catch (const std::exception& e) {
    reply(ErrorReply(std::string("control: internal error while handling the message: ") + e.what()));
  }
}

void Front::FlushReplies(const std::shared_ptr<JsonConn>& c) {
  auto it = replies_.find(c);
  if (it == replies_.end()) return;
  auto& q = it->second;
  while (!q.empty() && q.front()->has_value()) {
    if (c->alive()) c->Send(**q.front());
    q.pop_front();
  }
  if (q.empty()) replies_.erase(it);
}

void Front::HandleControl(const nlohmann::json& msg, const Reply& reply) {
  auto type = msg.find("type");
  if (type == msg.end() || !type->is_string()) {
    reply(
        ErrorReply("control: the message has no string field 'type'; send {\"type\":\"status\"} or "
                   "{\"type\":\"set_routes\",...}"));
    return;
  }
  const std::string& t = type->get_ref<const std::string&>();
  if (t == "status") {
    AskWorkers(
        [](Worker& w) {
          nlohmann::json j = w.proxy().StatusJson();
          j["connections"] = w.server().connection_count();
          return j;
        },
        [this, reply](const std::vector<nlohmann::json>& parts) {
          nlohmann::json j = MergeLoopStatus(parts);
          // Per loop: the share each serves (an uneven split shows here).
          j["loop_load"] = nlohmann::json::array();
          for (const auto& p : parts) {
            if (!p.is_object()) continue;
            j["loop_load"].push_back({{"connections", p.value("connections", 0)},
                                      {"requests", p["counters"].value("requests", 0)}});
          }
          j["ok"] = true;
          j["listen"] = listen_address_;
          j["pid"] = static_cast<int64_t>(::getpid());
          j["loops"] = workers_.size();
          j["accepted"] = acceptor_.accepted();
          j["control_clients"] = control_ ? control_->client_count() : 0;
          j["active"] = active_ ? nlohmann::json(active_->ToString()) : nlohmann::json(nullptr);
          j["standby"] = standby_ ? nlohmann::json(standby_->ToString()) : nlohmann::json(nullptr);
          j["epoch"] = epoch_;
          j["counters"]["switched_self"] = switched_self_;
          j["hedging"] = {{"after_ms", hedge_.after_ms},
                          {"percent", hedge_.percent},
                          {"burst", hedge_.burst},
                          {"budget", shared_.hedge_budget()}};
          for (const auto& e : event_log_) j["events"].push_back(e);
          reply(std::move(j));
        });
    return;
  }
  if (t == "set_routes") {
    SetRoutes(msg, reply);
    return;
  }
  if (t == "set_limits") {
    SetLimits(msg, reply);
    return;
  }
  if (t == "engine_dead") {
    EngineDead(msg, reply);
    return;
  }
  reply(ErrorReply("control: unknown message type '" + t.substr(0, 64) +
                   "'; send one of: status, set_routes, set_limits, engine_dead"));
}

void Front::EngineDead(const nlohmann::json& msg, const Reply& reply) {
  auto engine = RouteField(msg, "engine", /*required=*/true, "engine_dead");
  if (!engine.ok()) return reply(ErrorReply(engine.error().message()));
  if (!engine->has_value()) {
    return reply(ErrorReply("engine_dead: field 'engine' is null; give the dead engine's HOST:PORT"));
  }
  std::string why = "died";
  if (auto w = msg.find("why"); w != msg.end() && w->is_string()) why = w->get<std::string>().substr(0, 512);
  AskWorkers([addr = **engine, why](Worker& w) -> nlohmann::json { return w.proxy().EngineDead(addr, why); },
             [reply](const std::vector<nlohmann::json>& answers) {
               int64_t cut = 0;
               for (const auto& a : answers) {
                 if (a.is_number_integer()) cut += a.get<int64_t>();
               }
               reply({{"ok", true}, {"cut", cut}});
             });
}

void Front::SetRoutes(const nlohmann::json& msg, const Reply& reply) {
  auto epoch_field = msg.find("epoch");
  if (epoch_field == msg.end() || !epoch_field->is_number_integer() || epoch_field->get<int64_t>() < 0) {
    reply(
        ErrorReply("set_routes: field 'epoch' is missing or not a non-negative integer; send the route "
                   "epoch, one more than the last"));
    return;
  }
  const int64_t epoch = epoch_field->get<int64_t>();
  auto active = RouteField(msg, "active", /*required=*/true);
  if (!active.ok()) return reply(ErrorReply(active.error().message()));
  auto standby = RouteField(msg, "standby", /*required=*/false);
  if (!standby.ok()) return reply(ErrorReply(standby.error().message()));
  if (standby->has_value() && !active->has_value()) {
    return reply(
        ErrorReply("set_routes: a standby without an active route; route an active engine too, or neither"));
  }
  // The loops check the same; checked here too so that every loop either
  // takes the change or none does.
  if (epoch < epoch_) {
    return reply(ErrorReply("set_routes: epoch " + std::to_string(epoch) +
                            " is older than the current epoch " + std::to_string(epoch_) +
                            "; a newer supervisor has steered this front: read its status "
                            "and send an epoch of at least " +
                            std::to_string(epoch_)));
  }
  if (active->has_value() && standby->has_value() && (*active)->ToString() == (*standby)->ToString()) {
    return reply(ErrorReply("set_routes: active and standby are both " + (*active)->ToString() +
                            "; route two different engines, or leave standby null"));
  }
  const std::string old_active = active_ ? active_->ToString() : "";
  active_ = *active;
  standby_ = *standby;
  epoch_ = epoch;
  const std::string new_active = active_ ? active_->ToString() : "";
  if (new_active != old_active) {
    first_ok_pending_ = new_active;
    first_ok_since_ms_ = RealClock().WallMs();
  }
  AskWorkers(
      [a = *active, s = *standby, epoch](Worker& w) -> nlohmann::json {
        Status st = w.proxy().SetRoutes(a, s, epoch);
        return st.ok() ? nlohmann::json(nullptr) : nlohmann::json(st.error().message());
      },
      [reply, epoch](const std::vector<nlohmann::json>& answers) {
        for (const auto& a : answers) {
          if (a.is_string()) {
            spdlog::error("front: a loop refused set_routes the front took: {}", a.get<std::string>());
            return reply(ErrorReply(a.get<std::string>()));
          }
        }
        reply({{"ok", true}, {"epoch", epoch}});
      });
}

void Front::SetLimits(const nlohmann::json& msg, const Reply& reply) {
  auto qt = msg.find("queue_timeout_ms");
  auto mq = msg.find("max_queued");
  if (qt == msg.end() || !qt->is_number_integer() || qt->get<int64_t>() < 0 || mq == msg.end() ||
      !mq->is_number_integer() || mq->get<int64_t>() < 0) {
    return reply(
        ErrorReply("set_limits: fields 'queue_timeout_ms' and 'max_queued' must be non-negative integers"));
  }
  // Hedging: optional, all three or none (a supervisor from before hedging sends none).
  std::optional<HedgeLimits> hedge;
  if (msg.contains("hedge_after_ms") || msg.contains("hedge_percent") || msg.contains("hedge_burst")) {
    HedgeLimits h;
    int64_t percent = -1, burst = -1;
    for (auto [key, out] : {std::pair<const char*, int64_t*>{"hedge_after_ms", &h.after_ms},
                            {"hedge_percent", &percent},
                            {"hedge_burst", &burst}}) {
      auto it = msg.find(key);
      if (it == msg.end() || !it->is_number_integer()) {
        return reply(ErrorReply(std::string("set_limits: field '") + key +
                                "' is missing or not an integer; send hedge_after_ms, hedge_percent and "
                                "hedge_burst together"));
      }
      *out = it->get<int64_t>();
    }
    // Out of int's range: Check() refuses the clamped value with the range.
    h.percent = static_cast<int>(std::clamp<int64_t>(percent, -1, 1'000'001));
    h.burst = static_cast<int>(std::clamp<int64_t>(burst, -1, 1'000'001));
    if (Status st = h.Check(); !st.ok()) return reply(ErrorReply("set_limits: " + st.error().message()));
    hedge = h;
  }
  const int64_t queue_timeout = qt->get<int64_t>();
  const size_t max_queued = static_cast<size_t>(mq->get<int64_t>());
  spdlog::info("front: queue timeout {} ms, at most {} queued", queue_timeout, max_queued);
  if (hedge) {
    hedge_ = *hedge;
    spdlog::info("front: hedging {}", hedge->after_ms > 0
                                          ? "after " + std::to_string(hedge->after_ms) + " ms of silence, " +
                                                std::to_string(hedge->percent) + "% + " +
                                                std::to_string(hedge->burst) + " saved"
                                          : std::string("off"));
  }
  AskWorkers(
      [queue_timeout, max_queued, hedge](Worker& w) -> nlohmann::json {
        w.proxy().SetLimits(queue_timeout, max_queued);
        if (hedge) w.proxy().SetHedging(*hedge);
        return nullptr;
      },
      [reply](const std::vector<nlohmann::json>&) {
        reply({{"ok", true}});
      });
}

void Front::OnWorkerEvent(int worker, const nlohmann::json& event) {
  const std::string kind = event.value("kind", "");
  const int64_t epoch = event.value("epoch", int64_t{-1});
  const std::string backend = event.value("backend", "");
  if (kind == "switched") {
    // Accepted once: from the loop that saw the active fail first, while the
    // routes are still the ones it switched from. The others follow.
    const std::string from = event.value("from", "");
    const std::string to = event.value("to", "");
    if (epoch != epoch_ || !active_ || !standby_ || active_->ToString() != from || standby_->ToString() != to)
      return;
    active_ = standby_;
    standby_.reset();
    first_ok_pending_ = to;
    first_ok_since_ms_ = event.value("at_ms", int64_t{0});
    ++switched_self_;
    const std::string why = event.value("reason", "");
    const int64_t at_ms = std::max<int64_t>(1, event.value("at_ms", int64_t{1}));
    for (auto& w : workers_) {
      if (w->index() == worker) continue;
      w->Post([from, why, epoch, at_ms](Worker& wk) { wk.proxy().PeerFailed(from, why, epoch, at_ms); });
    }
    Emit(event);
    return;
  }
  if (kind == "first_ok") {
    // Once per route change: the first loop to get a good answer says when.
    // Not by epoch: a loop that switched by itself just before the
    // supervisor's route change (to the same engine) reports at the old
    // epoch. By time instead: an answer from before this change is stale;
    // a hedge the new active won before it is what clients saw first.
    if (first_ok_pending_.empty() || backend != first_ok_pending_) return;
    if (!event.value("hedged", false) && event.value("at_ms", int64_t{0}) < first_ok_since_ms_) return;
    first_ok_pending_.clear();
    Emit(event);
    return;
  }
  // silent: the loop that flipped the shared flag is the only one that says it.
  Emit(event);
}

void Front::Emit(const nlohmann::json& event) {
  if (event_log_.size() >= Proxy::kEventLogSize) event_log_.pop_front();
  event_log_.push_back(event);
  if (control_) control_->Broadcast(event);
}

void Front::Stop(std::function<void()> done) {
  if (!close_.Begin(std::move(done))) return;
  acceptor_.Close([this] {
    --open_parts_;
    close_.Check();
  });
  if (workers_.empty()) {
    OnWorkerStopped();
    return;
  }
  spdlog::info("front: stopping; letting requests in flight finish (up to {} ms)", options_.drain_timeout_ms);
  for (auto& w : workers_) {
    const int64_t drain = options_.drain_timeout_ms;
    w->Post([this, drain](Worker& wk) {
      wk.Stop(
          drain, [this](std::function<void()> fn) { return mailbox_.Post(std::move(fn)); },
          [this] { OnWorkerStopped(); });
    });
  }
}

void Front::OnWorkerStopped() {
  if (!workers_.empty() && ++stopped_workers_ < workers_.size()) return;
  for (auto& w : workers_) w->Exit();
  if (control_)
    control_->Close([this] {
      --open_parts_;
      close_.Check();
    });
  mailbox_.Close([this] {
    --open_parts_;
    close_.Check();
  });
}

// ---- the program ----

int FrontMain(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);  // a vanished peer is an error code, not a death
  CLI::App app{
      "wsup-front: the data plane. An HTTP/1.1 proxy in front of the active engine, steered by the "
      "supervisor over a control socket; it fails over, retries and resumes streams by itself.",
      "wsup-front"};
  FrontOptions o;
  std::string log_level = "info";
  uint64_t max_body = o.server.limits.max_body_bytes;
  uint64_t max_header = o.server.limits.max_header_bytes;
  uint64_t max_conns = o.server.max_connections;
  uint64_t max_queued = o.proxy.max_queued;
  uint64_t buffer_limit = o.proxy.buffer_limit_bytes;
  app.add_option("--listen", o.listen, "HOST:PORT to serve clients on (port 0: the kernel picks one)");
  app.add_option("--listen-fd", o.listen_fd,
                 "a bound, listening TCP socket to serve on (kept by the supervisor)");
  app.add_option("--control", o.control, "Unix socket path for the supervisor (mode 0600)");
  app.add_option("--active", o.active, "initial active engine HOST:PORT");
  app.add_option("--standby", o.standby, "initial standby engine HOST:PORT");
  app.add_option("--epoch", o.epoch, "epoch of the initial routes")->check(CLI::NonNegativeNumber);
  app.add_option("--queue-timeout-ms", o.proxy.queue_timeout_ms,
                 "how long a request waits for an engine before 503")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-queued", max_queued, "requests that may wait for an engine at once")
      ->check(CLI::PositiveNumber);
  app.add_option("--hedge-after-ms", o.proxy.hedge_after_ms,
                 "silence from the active engine after which a request is sent to the standby too (0: never)")
      ->check(CLI::Range(int64_t{0}, int64_t{3'600'000}));
  app.add_option("--hedge-percent", o.proxy.hedge_percent, "hedges earned per 100 requests")
      ->check(CLI::Range(0, 100));
  app.add_option("--hedge-burst", o.proxy.hedge_burst,
                 "hedges that can be saved up (and the starting balance)")
      ->check(CLI::Range(1, 1'000'000));
  app.add_option(
         "--loops", o.loops,
         "worker loops (threads) serving clients; 0: one per CPU this process may run on (at most 64)")
      ->check(CLI::Range(0, kMaxLoops));
  app.add_option("--ready-fd", o.ready_fd, "fd that gets one line 'listening on HOST:PORT' once serving");
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  app.add_option("--connect-timeout-ms", o.proxy.upstream.connect_timeout_ms,
                 "connect timeout towards an engine")
      ->check(CLI::PositiveNumber);
  app.add_option("--upstream-idle-ms", o.proxy.upstream.idle_timeout_ms,
                 "how long an unused engine connection is kept open")
      ->check(CLI::PositiveNumber);
  app.add_option("--buffer-limit-bytes", buffer_limit,
                 "answers with a Content-Length up to this are relayed in one piece");
  app.add_option("--max-retries", o.proxy.max_retries,
                 "re-sends (or stream resumes) of a request after an engine failure")
      ->check(CLI::Range(0, 10));
  app.add_option("--default-max-tokens", o.proxy.default_max_tokens, "the engines' default max_tokens")
      ->check(CLI::PositiveNumber);
  app.add_option("--header-timeout-ms", o.server.header_timeout_ms,
                 "a client's request headers must arrive within")
      ->check(CLI::PositiveNumber);
  app.add_option("--body-timeout-ms", o.server.body_timeout_ms, "a client's request body must arrive within")
      ->check(CLI::PositiveNumber);
  app.add_option("--idle-timeout-ms", o.server.idle_timeout_ms,
                 "an idle keep-alive client connection is closed after")
      ->check(CLI::PositiveNumber);
  app.add_option("--write-timeout-ms", o.server.write_timeout_ms,
                 "a client that reads nothing for this long is cut off")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-body-bytes", max_body, "largest request body accepted (413 beyond)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-header-bytes", max_header, "largest request line plus headers (431 beyond)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-connections", max_conns, "client connections served at once")
      ->check(CLI::PositiveNumber);
  app.add_option("--drain-timeout-ms", o.drain_timeout_ms,
                 "on SIGTERM, how long requests in flight may finish")
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  o.server.limits.max_body_bytes = max_body;
  o.server.limits.max_header_bytes = max_header;
  o.server.max_connections = max_conns;
  o.server.server_name = "wsup-front";
  o.proxy.max_queued = max_queued;
  o.proxy.buffer_limit_bytes = buffer_limit;
  if (o.listen.empty() == (o.listen_fd < 0)) {
    std::fprintf(stderr, "wsup-front: pass exactly one of --listen HOST:PORT or --listen-fd N\n");
    return 2;
  }
  InitLogging("wsup-front", log_level);

  uv_loop_t loop;
  uv_loop_init(&loop);
  int exit_code = 0;
  {
    Front front(&loop, o);
    // SIGTERM/SIGINT drain and stop; the watchers close once the front has.
    Signals signals(&loop);
    auto stop_front = [&] { front.Stop([&] { signals.Close(); }); };
    auto on_signal = [&](int signum) {
      spdlog::info("front: got signal {}; stopping", signum);
      stop_front();
    };
    signals.On(SIGTERM, on_signal);
    signals.On(SIGINT, on_signal);
    Status st = front.Start();
    if (!st.ok()) {
      spdlog::error("front: {}", st.error().message());
      std::fprintf(stderr, "wsup-front: %s\n", st.error().message().c_str());
      exit_code = 1;
      stop_front();
    }
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  uv_loop_close(&loop);
  return exit_code;
}

}  // namespace wsup::front
