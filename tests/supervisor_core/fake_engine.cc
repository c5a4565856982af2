#include "tests/supervisor_core/fake_engine.h"

#include <fcntl.h>

#include <future>

#include <nlohmann/json.hpp>

#include "http/control_auth.h"

namespace wsup::logic {

using nlohmann::json;

uint64_t FakeEngine::NextSeq() {
  static std::atomic<uint64_t> seq{0};
  return ++seq;
}

FakeEngine::FakeEngine(int port, std::string nonce, std::string probe_text, std::string control_token)
    : port_(port), nonce_(std::move(nonce)), probe_text_(std::move(probe_text)), control_token_(std::move(control_token)) {}

std::unique_ptr<FakeEngine> FakeEngine::Front(int listen_fd, std::string probe_text) {
  auto f = std::make_unique<FakeEngine>(0, "", std::move(probe_text));
  f->adopt_fd_ = listen_fd;
  return f;
}

FakeEngine::~FakeEngine() { Stop(); }

bool FakeEngine::Start() {
  std::promise<bool> bound;
  auto result = bound.get_future();
  thread_ = std::thread([this, &bound] {
    uv_loop_init(&loop_);
    stop_.data = this;
    uv_async_init(&loop_, &stop_, [](uv_async_t* a) {
      auto* self = static_cast<FakeEngine*>(a->data);
      self->hung_.clear();
      self->server_->Close([self] { uv_close(reinterpret_cast<uv_handle_t*>(&self->stop_), nullptr); });
    });
    http::ServerOptions so;
    so.host = "127.0.0.1";
    so.port = port_;
    server_ = std::make_unique<http::HttpServer>(&loop_, so,
                                                 [this](std::shared_ptr<http::ResponseWriter> w) { Handle(std::move(w)); });
    if (adopt_fd_ >= 0) {
      const int fd = ::fcntl(adopt_fd_, F_DUPFD_CLOEXEC, 3);
      bound.set_value(fd >= 0 && server_->Adopt(fd).ok());
    } else {
      bound.set_value(server_->Listen().ok());
    }
    uv_run(&loop_, UV_RUN_DEFAULT);
    server_.reset();
    uv_loop_close(&loop_);
  });
  started_ = true;
  const bool ok = result.get();
  if (!ok) Stop();
  return ok;
}

void FakeEngine::Stop() {
  if (!started_) return;
  started_ = false;
  uv_async_send(&stop_);
  thread_.join();
}

std::vector<FakeEngine::RoleCall> FakeEngine::role_calls() const {
  std::lock_guard<std::mutex> lk(mu_);
  return calls_;
}

std::string FakeEngine::KvJson() const {
  return json{{"source", pool_mapped_ ? "pool" : "scratch"}, {"bytes", pool_mapped_ ? 17 << 20 : 1 << 20},
              {"scratch_bytes", 1 << 20}, {"map_ms", 0.5}}
      .dump();
}

void FakeEngine::Handle(std::shared_ptr<http::ResponseWriter> w) {
  const auto& r = w->request();
  if (http::IsControlPath(r.path) && !http::CheckControlAuth(r, control_token_).ok()) {
    ++unauthorized_;
    w->Send(http::HttpResponse::Json(401, "{}"));
    return;
  }
  if (r.path == "/wsup/status") {
    json j{{"state", "ready"},
           {"nonce", nonce_},
           {"kv", json::parse(KvJson())},
           {"comm", {{"kind", "none"}, {"warm", warm_.load()}}},
           {"resume", {{"adopted_sequences", resumed_.load()}, {"adopted_tokens", 0}, {"recomputed_sequences", 0}}}};
    w->Send(http::HttpResponse::Json(200, j.dump()));
  } else if (r.path == "/v1/completions") {
    json j{{"choices", json::array({json{{"text", probe_text_}, {"index", 0}, {"finish_reason", "length"}}})}};
    w->Send(http::HttpResponse::Json(200, j.dump()));
  } else if (r.path == "/wsup/role") {
    json body = json::parse(r.body, nullptr, false);
    RoleCall c;
    c.seq = NextSeq();
    c.role = body.value("role", "");
    c.kv = body.value("kv", "scratch");
    {
      std::lock_guard<std::mutex> lk(mu_);
      calls_.push_back(c);
    }
    if (c.kv == "pool") {
      pool_mapped_ = true;
    } else if (pool_mapped_) {
      if (release_ == Release::kHang) {
        hung_.push_back(w);
        return;
      }
      if (release_ == Release::kRefuse) {
        w->Send(http::HttpResponse::Json(409, json{{"error", "refused (test)"}, {"kv", json::parse(KvJson())}}.dump()));
        return;
      }
      pool_mapped_ = false;
    }
    w->Send(http::HttpResponse::Json(200, json{{"role", c.role}, {"kv", json::parse(KvJson())}}.dump()));
  } else {
    w->Send(http::HttpResponse::Json(404, "{}"));
  }
}

}  // namespace wsup::logic
