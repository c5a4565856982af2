// The HTTP routes (engine/engine.h): completions and the requests in
// flight, /health, /v1/models, and the dispatch that checks the control
// token before anything else. POST /wsup/role is in engine_kv_role.cc,
// GET /wsup/status in engine_status.cc.
#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "http/control_auth.h"

namespace wsup::engine {

using nlohmann::json;

void Engine::OnEvents() {
  std::vector<GenEvent> events;
  {
    std::lock_guard<std::mutex> lk(mu_);
    events.swap(outbox_);
    outbox_posted_ = false;
  }
  for (auto& ev : events) {
    auto it = pending_.find(ev.id);
    if (it == pending_.end()) continue;  // its client went away
    Pending& p = it->second;
    if (!ev.done) {
      p.tokens.insert(p.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      if (p.stream) p.writer->Write(http::SseEvent(StreamChunk(p, ev.tokens, "")));
      continue;
    }
    FinishPending(ev.id, p, ev);
    pending_.erase(ev.id);
  }
}

std::string Engine::StreamChunk(Pending& p, const std::vector<int32_t>& ids, const std::string& finish_reason) {
  std::string delta;
  for (int32_t t : ids) delta += p.stream_text->Add(t);
  if (!finish_reason.empty()) delta += p.stream_text->Finish();
  if (p.chat) return ChatChunkJson(p.text, delta, ids, finish_reason, p.token_ids);
  const std::vector<int32_t>* prompt = p.token_ids && !p.sent_first ? &p.prompt : nullptr;
  p.sent_first = true;
  return StreamChunkJson(p.text, delta, ids, finish_reason, p.token_ids, prompt);
}

void Engine::FinishPending(uint64_t id, Pending& p, const GenEvent& ev) {
  p.tokens.insert(p.tokens.end(), ev.tokens.begin(), ev.tokens.end());
  auto& w = p.writer;
  w->OnClose(nullptr);
  if (ev.error) {
    const std::string msg = "generation failed: " + ev.error->message();
    if (p.stream) {
      w->Write(http::SseEvent(http::ErrorJson(msg, "server_error")));
      w->Write(http::SseEvent("[DONE]"));
      w->End();
    } else {
      SendError(w, 500, msg, "server_error");
    }
    return;
  }
  const int64_t n = static_cast<int64_t>(p.tokens.size());
  if (p.stream) {
    w->Write(http::SseEvent(StreamChunk(p, ev.tokens, ev.finish_reason)));
    if (p.include_usage) {
      w->Write(http::SseEvent(p.chat ? ChatUsageChunkJson(p.text, p.prompt_tokens, n)
                                     : UsageChunkJson(p.text, p.prompt_tokens, n)));
    }
    w->Write(http::SseEvent("[DONE]"));
    w->End();
  } else {
    std::string text;
    for (int32_t t : p.tokens) text += p.stream_text->Add(t);
    text += p.stream_text->Finish();
    const std::vector<int32_t>* prompt = p.token_ids ? &p.prompt : nullptr;
    w->Send(http::HttpResponse::Json(
        200, p.chat ? ChatCompletionJson(p.text, text, p.tokens, ev.finish_reason, prompt, p.prompt_tokens)
                    : CompletionJson(p.text, text, p.tokens, ev.finish_reason, prompt, p.prompt_tokens)));
  }
}

bool Engine::ServesNow(const std::shared_ptr<http::ResponseWriter>& w) {
  if (ready()) return true;
  SendError(w, 503, std::string("the engine is ") + state_name() + " (loading the model); retry when GET /wsup/status says ready",
            "unavailable_error", {{"Retry-After", "1"}});
  return false;
}

ApiLimits Engine::Limits() const {
  ApiLimits limits;
  limits.vocab = runner_->dims().vocab;
  limits.context = runner_->dims().max_pos;
  limits.text = text_.get();
  return limits;
}

void Engine::SendError(const std::shared_ptr<http::ResponseWriter>& w, int status, const std::string& message,
                       const std::string& type, std::vector<http::Header> extra) {
  http::HttpResponse r = http::HttpResponse::Json(status, http::ErrorJson(message, type));
  for (auto& h : extra) r.headers.push_back(std::move(h));
  w->Send(std::move(r));
}

void Engine::Route(std::shared_ptr<http::ResponseWriter> w) {
  const auto& r = w->request();
  auto only = [&](const char* method) {
    if (r.method == method || (std::string(method) == "GET" && r.method == "HEAD")) return true;
    SendError(w, 405, "method " + r.method + " is not allowed on " + r.path + "; use " + method, "invalid_request_error",
              {{"Allow", method}});
    return false;
  };
  // The control routes are the supervisor's alone (http/control_auth.h):
  // checked before the method, so that nothing about them is told to
  // anyone else.
  if (http::IsControlPath(r.path)) {
    if (Status auth = http::CheckControlAuth(r, opts_.control_token); !auth.ok()) {
      SendError(w, 401, auth.error().message(), "authentication_error", {{"WWW-Authenticate", "Bearer"}});
      return;
    }
  }
  // Each route's path, method and handler.
  struct RouteRow {
    const char* path;
    const char* method;
    void (Engine::*handle)(const std::shared_ptr<http::ResponseWriter>&);
  };
  static constexpr RouteRow kRoutes[] = {
      {"/v1/completions", "POST", &Engine::HandleCompletion},
      {"/v1/chat/completions", "POST", &Engine::HandleChat},
      {"/tokenize", "POST", &Engine::HandleTokenize},
      {"/detokenize", "POST", &Engine::HandleDetokenize},
      {"/v1/models", "GET", &Engine::HandleModels},
      {"/health", "GET", &Engine::HandleHealth},
      {"/wsup/status", "GET", &Engine::HandleStatus},
      {"/wsup/role", "POST", &Engine::HandleRole},
  };
  for (const RouteRow& row : kRoutes) {
    if (r.path != row.path) continue;
    if (only(row.method)) (this->*row.handle)(w);
    return;
  }
  SendError(w, 404, "no route " + r.path.substr(0, 200) +
                        "; the engine serves POST /v1/completions, /v1/chat/completions, /tokenize and /detokenize, GET "
                        "/v1/models, /health, /wsup/status and POST /wsup/role",
            "not_found_error");
}

void Engine::HandleCompletion(const std::shared_ptr<http::ResponseWriter>& w) {
  if (!ServesNow(w)) return;
  auto req = ParseCompletionRequest(w->request().body, Limits());
  if (!req.ok()) {
    SendError(w, 400, req.error().message(), "invalid_request_error");
    return;
  }
  StartGeneration(w, *req, /*chat=*/false);
}

void Engine::StartGeneration(const std::shared_ptr<http::ResponseWriter>& w, const CompletionRequest& r, bool chat) {
  const CompletionRequest* req = &r;
  GenRequest g;
  g.id = ++next_id_;
  g.prompt = req->prompt;
  g.max_tokens = req->max_tokens;
  g.temperature = req->temperature;
  g.seed = req->seed ? *req->seed : seed_rng_();
  g.stop_tokens = eos_;
  g.request_id = w->request().request_id;
  // The front's mark on a stream it resumes after the engine it ran on
  // failed (docs/kv_journal.md): its KV may be adopted from the journal.
  if (const std::string* resume = w->request().FindHeader("X-Wsup-Resume")) g.resumed = *resume == "cut";
  // The supervisor's semantic probe goes first (engine/scheduler.h): only
  // with the control token, so that no client can jump the queue (the front
  // never forwards the header either). An engine started by hand, without
  // a token, takes the header from anyone.
  if (const std::string* probe = w->request().FindHeader("X-Wsup-Probe")) {
    g.probe = *probe == "semantic" && http::CheckControlAuth(w->request(), opts_.control_token).ok();
  }
  const uint64_t id = g.id;
  Status st = scheduler_->Submit(std::move(g));
  if (!st.ok()) {
    if (st.code() == Code::kInvalidArgument) {
      SendError(w, 400, st.error().message(), "invalid_request_error");
    } else {
      SendError(w, 503, st.error().message(), "unavailable_error", {{"Retry-After", "1"}});
    }
    return;
  }
  Pending p;
  p.writer = w;
  p.text.id = (chat ? "chatcmpl-" : "cmpl-") + w->request().request_id;
  p.chat = chat;
  p.text.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  p.text.model = opts_.model_name;
  p.stream = req->stream;
  p.token_ids = req->return_token_ids;
  p.include_usage = req->include_usage;
  p.prompt_tokens = static_cast<int64_t>(req->prompt.size());
  if (p.token_ids) p.prompt = req->prompt;
  // The output's text is a stream over the prompt and what follows: a
  // continuation whose prompt ends inside a character (a resumed stream)
  // reads as the uninterrupted stream would.
  p.stream_text = text_->Stream(/*skip_special_tokens=*/true);
  p.stream_text->Prime(req->prompt);
  if (p.stream) {
    w->StartStream(200, {{"Content-Type", "text/event-stream"}, {"Cache-Control", "no-cache"}});
    if (chat) {
      // A chat stream opens with the role (and the prompt's ids).
      w->Write(http::SseEvent(ChatRoleChunkJson(p.text, p.token_ids ? &p.prompt : nullptr)));
      p.sent_first = true;
    }
  }
  // A client that goes away stops its generation and frees its KV blocks.
  w->OnClose([this, id] {
    if (scheduler_) scheduler_->Cancel(id);
    pending_.erase(id);
  });
  pending_.emplace(id, std::move(p));
}

void Engine::HandleHealth(const std::shared_ptr<http::ResponseWriter>& w) {
  // Liveness: this loop answers; the scheduler thread runs; the communicator
  // passes its keepalive. While starting, the loop alone is the answer.
  if (scheduler_) {
    SchedulerStats s = scheduler_->stats();
    if (!s.running) {
      SendError(w, 503, "the scheduler is not running", "unavailable_error");
      return;
    }
    if (!s.comm_ok) {
      SendError(w, 503, "the communicator failed its keepalive: " + s.comm_error, "unavailable_error");
      return;
    }
  }
  w->Send(http::HttpResponse::Json(200, json{{"status", "ok"}, {"state", state_name()}}.dump()));
}

void Engine::HandleModels(const std::shared_ptr<http::ResponseWriter>& w) {
  json m = {{"id", opts_.model_name}, {"object", "model"}, {"owned_by", "wsup"}, {"root", opts_.model_dir}};
  if (runner_ && state_ == EngineState::kReady) m["max_model_len"] = runner_->dims().max_pos;
  json j = {{"object", "list"}, {"data", json::array({m})}};
  w->Send(http::HttpResponse::Json(200, j.dump(-1, ' ', false, json::error_handler_t::replace)));
}

}  // namespace wsup::engine
