#include "front/front.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/log.h"
#include "front/control_socket.h"

namespace wsup::front {

namespace {

// An optional "HOST:PORT" field of set_routes: a string, null, or (standby only) absent.
Result<std::optional<HostPort>> RouteField(const nlohmann::json& msg, const char* key, bool required) {
  auto it = msg.find(key);
  if (it == msg.end()) {
    if (required) {
      return InvalidArgument(std::string("set_routes: field '") + key +
                             "' is missing; send \"HOST:PORT\" or null (no route)");
    }
    return std::optional<HostPort>();
  }
  if (it->is_null()) return std::optional<HostPort>();
  if (!it->is_string()) {
    return InvalidArgument(std::string("set_routes: field '") + key + "' is " + it->type_name() +
                           "; send \"HOST:PORT\" or null");
  }
  auto hp = ParseHostPort(it->get_ref<const std::string&>(), std::string("set_routes.") + key);
  if (!hp.ok()) return hp.error();
  return std::optional<HostPort>(std::move(hp).value());
}

}  // namespace

Front::Front(uv_loop_t* loop, FrontOptions options) : loop_(loop), options_(std::move(options)) {
  proxy_ = std::make_unique<Proxy>(loop_, options_.proxy, [this](const nlohmann::json& event) {
    if (control_) control_->Broadcast(event);
  });
  open_parts_ = 1;  // the proxy
  uv_timer_init(loop_, &drain_timer_);
  drain_timer_.data = this;
  ++open_parts_;
}

Front::~Front() {
  if (open_parts_ != 0) spdlog::error("front: destroyed while open; call Stop() and run the loop until done");
}

Status Front::Start() {
  if (started_ || stopping_) return Internal("front: Start() called twice or after Stop()");
  started_ = true;
  // Routes first: a bad flag should fail before the socket is taken.
  std::optional<HostPort> active, standby;
  if (!options_.active.empty()) {
    WSUP_ASSIGN_OR_RETURN(HostPort a, ParseHostPort(options_.active, "--active"));
    active = std::move(a);
  }
  if (!options_.standby.empty()) {
    WSUP_ASSIGN_OR_RETURN(HostPort s, ParseHostPort(options_.standby, "--standby"));
    standby = std::move(s);
  }
  if (standby && !active) {
    return InvalidArgument("--standby is given without --active; pass --active too (the standby only takes over "
                           "from an active engine)");
  }
  WSUP_RETURN_IF_ERROR(proxy_->SetRoutes(active, standby, options_.epoch));

  http::ServerOptions so = options_.server;
  std::optional<HostPort> listen;
  if (options_.listen_fd < 0) {
    WSUP_ASSIGN_OR_RETURN(HostPort l, ParseHostPort(options_.listen, "--listen", /*allow_port_zero=*/true));
    so.host = l.host;
    so.port = l.port;
    listen = std::move(l);
  }
  server_ = std::make_unique<http::HttpServer>(
      loop_, so, [this](std::shared_ptr<http::ResponseWriter> w) { proxy_->Handle(std::move(w)); });
  ++open_parts_;
  if (listen) {
    WSUP_RETURN_IF_ERROR(server_->Listen());
    listen->port = server_->port();
    listen_address_ = listen->ToString();
  } else {
    auto name = SocketName(options_.listen_fd);
    if (!name.ok()) return name.error().With("--listen-fd " + std::to_string(options_.listen_fd));
    WSUP_RETURN_IF_ERROR(server_->Adopt(options_.listen_fd));
    listen_address_ = name->ToString();
  }

  if (!options_.control.empty()) {
    control_ = std::make_unique<JsonServer>(
        loop_, options_.control,
        [this](const std::shared_ptr<JsonConn>& c, const nlohmann::json& m) {
          nlohmann::json reply;
          try {
            reply = HandleControl(m);
          } catch (const std::exception& e) {
            reply = ErrorReply(std::string("control: internal error while handling the message: ") + e.what());
          }
          c->Send(reply);
        },
        ControlSocketOptions());
    ++open_parts_;
    WSUP_RETURN_IF_ERROR(control_->Listen());
  }

  std::string line = "listening on " + listen_address_ + "\n";
  std::fputs(line.c_str(), stdout);
  std::fflush(stdout);
  if (options_.ready_fd >= 0) {
    ssize_t n = ::write(options_.ready_fd, line.data(), line.size());
    if (n != static_cast<ssize_t>(line.size())) {
      spdlog::warn("front: could not write the ready line to --ready-fd {}: {}", options_.ready_fd,
                   n < 0 ? std::strerror(errno) : "short write");
    }
    ::close(options_.ready_fd);
    options_.ready_fd = -1;
  }
  spdlog::info("front: listening on {}, control {}, active {}, standby {}, epoch {}", listen_address_,
               options_.control.empty() ? "none" : options_.control, active ? active->ToString() : "none",
               standby ? standby->ToString() : "none", options_.epoch);
  return Status::Ok();
}

nlohmann::json Front::HandleControl(const nlohmann::json& msg) {
  auto type = msg.find("type");
  if (type == msg.end() || !type->is_string()) {
    return ErrorReply("control: the message has no string field 'type'; send {\"type\":\"status\"} or "
                      "{\"type\":\"set_routes\",...}");
  }
  const std::string& t = type->get_ref<const std::string&>();
  if (t == "status") {
    nlohmann::json j = proxy_->StatusJson();
    j["ok"] = true;
    j["listen"] = listen_address_;
    j["pid"] = static_cast<int64_t>(::getpid());
    j["control_clients"] = control_ ? control_->client_count() : 0;
    return j;
  }
  if (t == "set_routes") {
    auto epoch = msg.find("epoch");
    if (epoch == msg.end() || !epoch->is_number_integer() || epoch->get<int64_t>() < 0) {
      return ErrorReply("set_routes: field 'epoch' is missing or not a non-negative integer; send the route "
                        "epoch, one more than the last");
    }
    auto active = RouteField(msg, "active", /*required=*/true);
    if (!active.ok()) return ErrorReply(active.error().message());
    auto standby = RouteField(msg, "standby", /*required=*/false);
    if (!standby.ok()) return ErrorReply(standby.error().message());
    if (standby->has_value() && !active->has_value()) {
      return ErrorReply("set_routes: a standby without an active route; route an active engine too, or neither");
    }
    Status st = proxy_->SetRoutes(*active, *standby, epoch->get<int64_t>());
    if (!st.ok()) return ErrorReply(st.error().message());
    return {{"ok", true}, {"epoch", epoch->get<int64_t>()}};
  }
  if (t == "set_limits") {
    auto qt = msg.find("queue_timeout_ms");
    auto mq = msg.find("max_queued");
    if (qt == msg.end() || !qt->is_number_integer() || qt->get<int64_t>() < 0 || mq == msg.end() ||
        !mq->is_number_integer() || mq->get<int64_t>() < 0) {
      return ErrorReply("set_limits: fields 'queue_timeout_ms' and 'max_queued' must be non-negative integers");
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
          return ErrorReply(std::string("set_limits: field '") + key +
                            "' is missing or not an integer; send hedge_after_ms, hedge_percent and hedge_burst "
                            "together");
        }
        *out = it->get<int64_t>();
      }
      // Out of int's range: Check() refuses the clamped value with the range.
      h.percent = static_cast<int>(std::clamp<int64_t>(percent, -1, 1'000'001));
      h.burst = static_cast<int>(std::clamp<int64_t>(burst, -1, 1'000'001));
      if (Status st = h.Check(); !st.ok()) return ErrorReply("set_limits: " + st.error().message());
      hedge = h;
    }
    proxy_->SetLimits(qt->get<int64_t>(), static_cast<size_t>(mq->get<int64_t>()));
    spdlog::info("front: queue timeout {} ms, at most {} queued", qt->get<int64_t>(), mq->get<int64_t>());
    if (hedge) {
      proxy_->SetHedging(*hedge);
      spdlog::info("front: hedging {}", hedge->after_ms > 0 ? "after " + std::to_string(hedge->after_ms) +
                                                                   " ms of silence, " +
                                                                   std::to_string(hedge->percent) + "% + " +
                                                                   std::to_string(hedge->burst) + " saved"
                                                             : std::string("off"));
    }
    return {{"ok", true}};
  }
  return ErrorReply("control: unknown message type '" + t.substr(0, 64) +
                    "'; send one of: status, set_routes, set_limits");
}

void Front::Stop(std::function<void()> done) {
  if (done) done_ = std::move(done);
  if (stopping_) {
    MaybeDone();
    return;
  }
  stopping_ = true;
  if (proxy_->call_count() == 0 || options_.drain_timeout_ms <= 0) {
    CloseAll();
    return;
  }
  spdlog::info("front: stopping; letting {} requests in flight finish (up to {} ms)", proxy_->call_count(),
               options_.drain_timeout_ms);
  drain_deadline_ms_ = static_cast<int64_t>(uv_now(loop_)) + options_.drain_timeout_ms;
  uv_timer_start(
      &drain_timer_,
      [](uv_timer_t* t) {
        auto* self = static_cast<Front*>(t->data);
        if (self->proxy_->call_count() == 0 || static_cast<int64_t>(uv_now(self->loop_)) >= self->drain_deadline_ms_) {
          uv_timer_stop(t);
          self->CloseAll();
        }
      },
      20, 20);
}

void Front::CloseAll() {
  auto part_done = [this] {
    --open_parts_;
    MaybeDone();
  };
  uv_close(reinterpret_cast<uv_handle_t*>(&drain_timer_), [](uv_handle_t* h) {
    auto* self = static_cast<Front*>(h->data);
    --self->open_parts_;
    self->MaybeDone();
  });
  // Clients first (their calls end), then the engines' side, then control.
  if (server_) server_->Close(part_done);
  proxy_->Close(part_done);
  if (control_) control_->Close(part_done);
}

void Front::MaybeDone() {
  if (open_parts_ != 0 || !done_) return;
  auto done = std::move(done_);
  done_ = nullptr;
  done();
}

// ---- the program ----

int FrontMain(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);  // a vanished peer is an error code, not a death
  CLI::App app{"wsup-front: the data plane. An HTTP/1.1 proxy in front of the active engine, steered by the "
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
  app.add_option("--listen-fd", o.listen_fd, "a bound, listening TCP socket to serve on (kept by the supervisor)");
  app.add_option("--control", o.control, "Unix socket path for the supervisor (mode 0600)");
  app.add_option("--active", o.active, "initial active engine HOST:PORT");
  app.add_option("--standby", o.standby, "initial standby engine HOST:PORT");
  app.add_option("--epoch", o.epoch, "epoch of the initial routes")->check(CLI::NonNegativeNumber);
  app.add_option("--queue-timeout-ms", o.proxy.queue_timeout_ms, "how long a request waits for an engine before 503")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-queued", max_queued, "requests that may wait for an engine at once")
      ->check(CLI::PositiveNumber);
  app.add_option("--hedge-after-ms", o.proxy.hedge_after_ms,
                 "silence from the active engine after which a request is sent to the standby too (0: never)")
      ->check(CLI::Range(int64_t{0}, int64_t{3'600'000}));
  app.add_option("--hedge-percent", o.proxy.hedge_percent, "hedges earned per 100 requests")
      ->check(CLI::Range(0, 100));
  app.add_option("--hedge-burst", o.proxy.hedge_burst, "hedges that can be saved up (and the starting balance)")
      ->check(CLI::Range(1, 1'000'000));
  app.add_option("--ready-fd", o.ready_fd, "fd that gets one line 'listening on HOST:PORT' once serving");
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  app.add_option("--connect-timeout-ms", o.proxy.upstream.connect_timeout_ms, "connect timeout towards an engine")
      ->check(CLI::PositiveNumber);
  app.add_option("--upstream-idle-ms", o.proxy.upstream.idle_timeout_ms,
                 "how long an unused engine connection is kept open")
      ->check(CLI::PositiveNumber);
  app.add_option("--buffer-limit-bytes", buffer_limit,
                 "answers with a Content-Length up to this are relayed in one piece");
  app.add_option("--max-retries", o.proxy.max_retries, "re-sends (or stream resumes) of a request after an engine failure")
      ->check(CLI::Range(0, 10));
  app.add_option("--default-max-tokens", o.proxy.default_max_tokens, "the engines' default max_tokens")
      ->check(CLI::PositiveNumber);
  app.add_option("--header-timeout-ms", o.server.header_timeout_ms, "a client's request headers must arrive within")
      ->check(CLI::PositiveNumber);
  app.add_option("--body-timeout-ms", o.server.body_timeout_ms, "a client's request body must arrive within")
      ->check(CLI::PositiveNumber);
  app.add_option("--idle-timeout-ms", o.server.idle_timeout_ms, "an idle keep-alive client connection is closed after")
      ->check(CLI::PositiveNumber);
  app.add_option("--write-timeout-ms", o.server.write_timeout_ms, "a client that reads nothing for this long is cut off")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-body-bytes", max_body, "largest request body accepted (413 beyond)")->check(CLI::PositiveNumber);
  app.add_option("--max-header-bytes", max_header, "largest request line plus headers (431 beyond)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-connections", max_conns, "client connections served at once")->check(CLI::PositiveNumber);
  app.add_option("--drain-timeout-ms", o.drain_timeout_ms, "on SIGTERM, how long requests in flight may finish")
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
    // SIGTERM/SIGINT drain and stop; the handles close once the front has.
    struct Signals {
      Front* front;
      uv_signal_t term;
      uv_signal_t intr;
      void StopFront() {
        front->Stop([this] {
          uv_close(reinterpret_cast<uv_handle_t*>(&term), nullptr);
          uv_close(reinterpret_cast<uv_handle_t*>(&intr), nullptr);
        });
      }
    } signals{&front, {}, {}};
    uv_signal_init(&loop, &signals.term);
    uv_signal_init(&loop, &signals.intr);
    signals.term.data = &signals;
    signals.intr.data = &signals;
    auto on_signal = [](uv_signal_t* s, int signum) {
      spdlog::info("front: got signal {}; stopping", signum);
      static_cast<Signals*>(s->data)->StopFront();
    };
    uv_signal_start(&signals.term, on_signal, SIGTERM);
    uv_signal_start(&signals.intr, on_signal, SIGINT);
    Status st = front.Start();
    if (!st.ok()) {
      spdlog::error("front: {}", st.error().message());
      std::fprintf(stderr, "wsup-front: %s\n", st.error().message().c_str());
      exit_code = 1;
      signals.StopFront();
    }
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  uv_loop_close(&loop);
  return exit_code;
}

}  // namespace wsup::front
