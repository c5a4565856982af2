#include "tests/front/fake_engine.h"

#include <nlohmann/json.hpp>
#include <signal.h>

#include <cstdio>
#include <cstdlib>

namespace wsup::test {

using nlohmann::json;

std::vector<int64_t> FakeGenerate(std::vector<int64_t> context, int n) {
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the whole context
    for (int64_t t : context) {
      h ^= static_cast<uint64_t>(t) & 0xff;
      h *= 1099511628211ull;
    }
    auto t = static_cast<int64_t>((h >> 17) % 256);
    context.push_back(t);
    out.push_back(t);
  }
  return out;
}

std::string FakeText(const std::vector<int64_t>& ids) {
  std::string s;
  for (int64_t t : ids) {
    auto c = static_cast<unsigned>(t & 0xff);
    if (c < 0x80) {
      s.push_back(static_cast<char>(c));
    } else {
      s.push_back(static_cast<char>(0xc0 | (c >> 6)));
      s.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    }
  }
  return s;
}

std::vector<int64_t> FakeTokenize(const std::string& s) {
  std::vector<int64_t> ids = {999};
  for (unsigned char c : s) ids.push_back(1000 + c);
  return ids;
}

struct FakeEngine::Stream {
  uv_timer_t timer;
  FakeEngine* engine;
  std::shared_ptr<http::ResponseWriter> w;
  std::vector<int64_t> context;
  size_t prompt_len = 0;
  int max_tokens = 0;
  int sent = 0;
  bool ids = false;
  bool report_prompt = false;  // the first chunk carries prompt_token_ids
  bool chat = false;           // chat.completion.chunk events
  bool die = false;
  bool ended = false;
  std::string id;
};

FakeEngine::FakeEngine(std::string name) : name_(std::move(name)) {
  // Writes to a client that went away must fail, not kill the test.
  ::signal(SIGPIPE, SIG_IGN);
  uv_loop_init(&loop_);
  http::ServerOptions o;
  o.server_name = "fake-" + name_;
  server_ = std::make_unique<http::HttpServer>(&loop_, o, [this](std::shared_ptr<http::ResponseWriter> w) {
    Handle(std::move(w));
  });
  Status st = server_->Listen();
  if (!st.ok()) {
    std::fprintf(stderr, "fake engine %s: %s\n", name_.c_str(), st.ToString().c_str());
    std::abort();
  }
  port_ = server_->port();
  stop_.data = this;
  uv_async_init(&loop_, &stop_, [](uv_async_t* a) {
    auto* self = static_cast<FakeEngine*>(a->data);
    std::vector<Stream*> all(self->streams_.begin(), self->streams_.end());
    for (Stream* s : all) self->EndStream(s);
    for (auto& w : self->held_) w->OnClose(nullptr);
    self->held_.clear();
    self->server_->Close([self] { uv_close(reinterpret_cast<uv_handle_t*>(&self->stop_), nullptr); });
  });
  thread_ = std::thread([this] { uv_run(&loop_, UV_RUN_DEFAULT); });
}

FakeEngine::~FakeEngine() { Stop(); }

void FakeEngine::Stop() {
  if (stopped_) return;
  stopped_ = true;
  uv_async_send(&stop_);
  thread_.join();
  server_.reset();
  if (uv_loop_close(&loop_) != 0) {
    std::fprintf(stderr, "fake engine %s: loop not closed clean\n", name_.c_str());
    std::abort();
  }
}

std::string FakeEngine::last_body() {
  std::lock_guard<std::mutex> l(mu_);
  return last_body_;
}

std::string FakeEngine::last_path() {
  std::lock_guard<std::mutex> l(mu_);
  return last_path_;
}

std::string FakeRender(const json& messages) {
  std::string out;
  for (const auto& m : messages) out += m.value("role", "") + ":" + m.value("content", "") + "\n";
  return out;
}

std::string FakeEngine::last_request_id() {
  std::lock_guard<std::mutex> l(mu_);
  return last_request_id_;
}

std::string FakeEngine::last_resume_mark() {
  std::lock_guard<std::mutex> l(mu_);
  return last_resume_mark_;
}

std::string FakeEngine::last_probe_mark() {
  std::lock_guard<std::mutex> l(mu_);
  return last_probe_mark_;
}

bool FakeEngine::Misbehave(int m) {
  if (mode.load() != m) return false;
  return misbehave_times.fetch_sub(1) > 0;
}

void FakeEngine::Handle(std::shared_ptr<http::ResponseWriter> w) {
  ++requests;
  const auto& r = w->request();
  {
    std::lock_guard<std::mutex> l(mu_);
    last_body_ = r.body;
    last_path_ = r.path;
    const std::string* id = r.FindHeader("X-Request-Id");
    last_request_id_ = id ? *id : "";
    const std::string* mark = r.FindHeader("X-Wsup-Resume");
    last_resume_mark_ = mark ? *mark : "";
    const std::string* probe = r.FindHeader("X-Wsup-Probe");
    last_probe_mark_ = probe ? *probe : "";
  }
  if (Misbehave(kCloseOnRequest)) {
    w->Abort();
    return;
  }
  if (r.path == "/v1/whoami") {
    auto resp = http::HttpResponse::Text(200, name_);
    resp.headers.push_back({"X-Engine", name_});
    w->Send(std::move(resp));
    return;
  }
  if (r.path == "/health") {
    w->Send(http::HttpResponse::Json(200, "{\"ok\":true}"));
    return;
  }
  if (r.path == "/v1/big") {
    // A body larger than the front's buffer limit: relayed as it comes.
    auto resp = http::HttpResponse::Text(200, std::string(1 << 20, 'x'));
    w->Send(std::move(resp));
    return;
  }
  if (r.method == "POST" && (r.path == "/v1/completions" || r.path == "/v1/chat/completions")) {
    Complete(std::move(w));
    return;
  }
  w->Send(http::HttpResponse::Json(404, http::ErrorJson("no such path: " + r.path, "not_found")));
}

void FakeEngine::Complete(std::shared_ptr<http::ResponseWriter> w) {
  ++completions;
  json j = json::parse(w->request().body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    w->Send(http::HttpResponse::Json(400, http::ErrorJson("body is not JSON", "invalid_request_error")));
    return;
  }
  const bool chat = w->request().path == "/v1/chat/completions";
  std::vector<int64_t> prompt;
  if (chat) {
    if (!j.contains("messages") || !j["messages"].is_array()) {
      w->Send(http::HttpResponse::Json(400, http::ErrorJson("messages missing", "invalid_request_error")));
      return;
    }
    prompt = FakeTokenize(FakeRender(j["messages"]));
  } else if (j.contains("prompt") && j["prompt"].is_string()) {
    prompt = FakeTokenize(j["prompt"].get<std::string>());
  } else if (j.contains("prompt") && j["prompt"].is_array()) {
    for (const auto& t : j["prompt"]) prompt.push_back(t.get<int64_t>());
  } else {
    w->Send(http::HttpResponse::Json(400, http::ErrorJson("prompt missing", "invalid_request_error")));
    return;
  }
  int max_tokens = j.value("max_completion_tokens", j.value("max_tokens", 16));
  bool stream = j.value("stream", false);
  bool ids = j.value("return_token_ids", false);
  if (stream) {
    StartStream(std::move(w), std::move(prompt), max_tokens, ids, Misbehave(kDieAfterTokens), chat);
    return;
  }
  if (Misbehave(kHold)) {
    // A long generation: the answer would come much later. The engine
    // learns that the front gave up on it only when the connection closes.
    ++held;
    w->OnClose([this] { ++held_closed; });
    held_.push_back(std::move(w));
    return;
  }
  std::vector<int64_t> out = FakeGenerate(prompt, max_tokens);
  json choice = {{"index", 0}, {"text", FakeText(out)}, {"finish_reason", "length"}};
  if (chat) choice = {{"index", 0}, {"message", {{"role", "assistant"}, {"content", FakeText(out)}}}, {"finish_reason", "length"}};
  if (ids) choice["token_ids"] = out;
  if (ids && report_prompt_ids) choice["prompt_token_ids"] = prompt;
  json resp = {{"id", "cmpl-" + name_ + "-" + std::to_string(++next_id_)},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"model", "fake"},
               {"choices", json::array({choice})},
               {"usage",
                {{"prompt_tokens", prompt.size()},
                 {"completion_tokens", out.size()},
                 {"total_tokens", prompt.size() + out.size()}}}};
  std::string body = resp.dump();
  if (Misbehave(kPartialBody)) {
    w->StartStream(200, {{"Content-Type", "application/json"}, {"X-Engine", name_}});
    w->Write(body.substr(0, body.size() / 2));
    w->Abort();
    return;
  }
  auto r = http::HttpResponse::Json(200, body);
  r.headers.push_back({"X-Engine", name_});
  w->Send(std::move(r));
}

void FakeEngine::StartStream(std::shared_ptr<http::ResponseWriter> w, std::vector<int64_t> prompt, int max_tokens,
                             bool ids, bool misbehave, bool chat) {
  auto* s = new Stream;
  s->engine = this;
  s->w = w;
  s->prompt_len = prompt.size();
  s->report_prompt = ids && report_prompt_ids;
  s->chat = chat;
  s->context = std::move(prompt);
  s->max_tokens = max_tokens;
  s->ids = ids;
  s->die = misbehave;
  s->id = "cmpl-" + name_ + "-" + std::to_string(++next_id_);
  uv_timer_init(&loop_, &s->timer);
  s->timer.data = s;
  streams_.insert(s);
  ++streams_active;
  w->OnClose([this, s] {
    if (s->ended) return;
    ++client_closed;
    EndStream(s);
  });
  w->StartStream(200, {{"Content-Type", "text/event-stream"}, {"X-Engine", name_}});
  if (chat) {
    // A chat stream opens with the role, and the prompt's ids at the top.
    json ev = {{"id", s->id}, {"object", "chat.completion.chunk"}, {"model", "fake"},
               {"choices", json::array({{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"finish_reason", nullptr}}})}};
    if (s->report_prompt) ev["prompt_token_ids"] = s->context;
    s->report_prompt = false;
    w->Write("data: " + ev.dump() + "\n\n");
  }
  int delay = token_delay_ms.load();
  if (delay <= 0) {
    while (!s->ended) StepStream(s);
    return;
  }
  uv_timer_start(
      &s->timer, [](uv_timer_t* t) { static_cast<Stream*>(t->data)->engine->StepStream(static_cast<Stream*>(t->data)); },
      static_cast<uint64_t>(delay), static_cast<uint64_t>(delay));
}

void FakeEngine::StepStream(Stream* s) {
  if (s->ended) return;
  if (s->sent >= s->max_tokens) {
    s->w->Write("data: [DONE]\n\n");
    s->w->End();
    EndStream(s);
    return;
  }
  std::vector<int64_t> t = FakeGenerate(s->context, 1);
  s->context.push_back(t[0]);
  ++s->sent;
  bool last = s->sent == s->max_tokens;
  json choice = {{"index", 0}, {"text", FakeText(t)}, {"finish_reason", last ? json("length") : json(nullptr)}};
  if (s->chat) {
    choice = {{"index", 0}, {"delta", {{"content", FakeText(t)}}}, {"finish_reason", last ? json("length") : json(nullptr)}};
  }
  if (s->ids) choice["token_ids"] = t;
  if (s->report_prompt && s->sent == 1) {
    choice["prompt_token_ids"] = std::vector<int64_t>(s->context.begin(), s->context.begin() + static_cast<std::ptrdiff_t>(s->prompt_len));
  }
  json ev = {{"id", s->id},
             {"object", s->chat ? "chat.completion.chunk" : "text_completion"},
             {"model", "fake"},
             {"choices", json::array({choice})}};
  if (last) {
    ev["usage"] = {{"prompt_tokens", s->prompt_len},
                   {"completion_tokens", s->sent},
                   {"total_tokens", s->prompt_len + static_cast<size_t>(s->sent)}};
  }
  s->w->Write("data: " + ev.dump() + "\n\n");
  ++tokens_sent;
  if (s->ended) return;
  if (s->die && s->sent == die_after.load()) {
    s->w->Abort();
    EndStream(s);
  }
}

void FakeEngine::EndStream(Stream* s) {
  if (s->ended) return;
  s->ended = true;
  --streams_active;
  streams_.erase(s);
  s->w->OnClose(nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&s->timer), [](uv_handle_t* h) {
    auto* st = static_cast<Stream*>(h->data);
    delete st;
  });
}

}  // namespace wsup::test
