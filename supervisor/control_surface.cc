// ControlSurface (control_surface.h): the control socket and the admin
// listener, and how each request is read before the node acts on it.
#include "supervisor/control_surface.h"

#include "common/log.h"
#include "supervisor/messages.h"

namespace wsup {

using nlohmann::json;

ControlSurface::ControlSurface(uv_loop_t* loop, Metrics& metrics, Hooks hooks)
    : loop_(loop), metrics_(metrics), hooks_(std::move(hooks)) {}

ControlSurface::~ControlSurface() { Close(); }

Status ControlSurface::ListenControl(const std::string& path) {
  control_ = std::make_unique<JsonServer>(loop_, path, [this](const Conn& c, const json& m) { OnControl(c, m); });
  return control_->Listen();
}

Status ControlSurface::ListenAdmin(const std::string& host, int port) {
  http::ServerOptions ao;
  ao.host = host;
  ao.port = port;
  admin_ = std::make_unique<http::HttpServer>(loop_, ao,
                                              [this](const std::shared_ptr<http::ResponseWriter>& w) { OnAdmin(w); });
  return admin_->Listen();
}

int ControlSurface::admin_port() const { return admin_ ? admin_->port() : 0; }

void ControlSurface::Close(std::function<void()> done) {
  if (control_) control_->Close();
  if (admin_) {
    admin_->Close(std::move(done));
  } else if (done) {
    done();
  }
}

void ControlSurface::Release() {
  control_.reset();
  admin_.reset();
}

void ControlSurface::OnControl(const Conn& c, const json& msg) {
  // Every field is read by the parser, typed and checked: a request that
  // is not one gets an error reply naming the field, and changes nothing.
  auto req = ParseControlRequest(msg);
  if (!req.ok()) {
    spdlog::warn("control: refused a request from pid {}: {}", c->peer_pid(), req.error().message());
    metrics_.bad_messages["control"]++;
    c->Send(json{{"type", "error"}, {"message", req.error().message()}});
    return;
  }
  switch (req->kind) {
    case ControlRequest::Kind::kStatus:
      c->Send(hooks_.status());
      break;
    case ControlRequest::Kind::kFailover:
      hooks_.drill(c, req->kill);
      break;
    case ControlRequest::Kind::kReload:
      hooks_.reload(c, req->set);
      break;
    case ControlRequest::Kind::kStop:
      hooks_.stop(c);
      break;
  }
}

void ControlSurface::OnAdmin(const std::shared_ptr<http::ResponseWriter>& w) {
  const auto& req = w->request();
  // Read-only: what is not a read is refused, not answered as one.
  if (req.method != "GET" && req.method != "HEAD") {
    auto resp = http::HttpResponse::Json(
        405, http::ErrorJson("method " + req.method.substr(0, 16) + " is not allowed; the admin listener is read-only: "
                             "GET /metrics or /status",
                             "method_not_allowed"));
    resp.headers.push_back({"Allow", "GET, HEAD"});
    w->Send(std::move(resp));
    return;
  }
  if (req.path == "/metrics") {
    auto resp = http::HttpResponse::Text(200, hooks_.metrics());
    for (auto& h : resp.headers) {
      if (http::HeaderNameEquals(h.name, "Content-Type")) h.value = "text/plain; version=0.0.4";
    }
    w->Send(std::move(resp));
  } else if (req.path == "/status") {
    // Strings an engine or a child wrote (a probe's reason, an exit) are
    // not trusted to be UTF-8: replaced, never thrown on.
    w->Send(http::HttpResponse::Json(200, hooks_.status().dump(-1, ' ', false, json::error_handler_t::replace)));
  } else {
    w->Send(http::HttpResponse::Json(404, http::ErrorJson("no such path; try /metrics or /status", "not_found")));
  }
}

}  // namespace wsup
