// POST /tokenize and POST /detokenize (engine/engine.h): the checkpoint's
// tokenizer as completions use it, shaped as vLLM's servers shape these
// routes (engine/api.h). They answer once the model is loaded: the
// tokenizer is part of the load.
#include <string>
#include <vector>

#include "engine/engine.h"

namespace wsup::engine {

void Engine::HandleTokenize(const std::shared_ptr<http::ResponseWriter>& w) {
  if (!ready()) {
    SendError(w, 503, std::string("the engine is ") + state_name() + "; retry when GET /wsup/status says ready",
              "unavailable_error", {{"Retry-After", "1"}});
    return;
  }
  auto req = ParseTokenizeRequest(w->request().body);
  if (!req.ok()) {
    SendError(w, 400, req.error().message(), "invalid_request_error");
    return;
  }
  const std::vector<int32_t> ids = text_->Encode(req->prompt, req->add_special_tokens);
  w->Send(http::HttpResponse::Json(200, TokenizeJson(ids, runner_->dims().max_pos)));
}

void Engine::HandleDetokenize(const std::shared_ptr<http::ResponseWriter>& w) {
  if (!ready()) {
    SendError(w, 503, std::string("the engine is ") + state_name() + "; retry when GET /wsup/status says ready",
              "unavailable_error", {{"Retry-After", "1"}});
    return;
  }
  auto ids = ParseDetokenizeRequest(w->request().body, runner_->dims().vocab);
  if (!ids.ok()) {
    SendError(w, 400, ids.error().message(), "invalid_request_error");
    return;
  }
  w->Send(http::HttpResponse::Json(200, DetokenizeJson(text_->Decode(*ids, /*skip_special_tokens=*/false))));
}

}  // namespace wsup::engine
