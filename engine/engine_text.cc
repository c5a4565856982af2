// POST /v1/chat/completions, /tokenize and /detokenize (engine/engine.h):
// the checkpoint's chat template and tokenizer, as completions use them,
// shaped as vLLM's servers shape these routes (engine/api.h). They answer
// once the model is loaded: the tokenizer is part of the load.
#include <string>
#include <vector>

#include "engine/engine.h"

namespace wsup::engine {

namespace {

// A chat's prompt ids: rendered by the template, encoded. The template's
// refusals (no template, raise_exception, a value it cannot use) are the
// client's to fix: their message is the answer.
Result<std::vector<int32_t>> ChatIds(const TextCodec& text, const ChatRequest& chat) {
  auto rendered = text.RenderChat(chat.messages, chat.add_generation_prompt, chat.extra);
  if (!rendered.ok()) return InvalidArgument("the chat template: " + rendered.error().message());
  return text.Encode(*rendered, chat.add_special_tokens);
}

}  // namespace

void Engine::HandleChat(const std::shared_ptr<http::ResponseWriter>& w) {
  if (!ServesNow(w)) return;
  auto req = ParseChatRequest(w->request().body);
  if (!req.ok()) {
    SendError(w, 400, req.error().message(), "invalid_request_error");
    return;
  }
  auto ids = ChatIds(*text_, *req);
  Status fit = ids.ok() ? FitChatPrompt(std::move(ids).value(), Limits(), &*req) : Status(ids.error());
  if (!fit.ok()) {
    SendError(w, 400, fit.error().message(), "invalid_request_error");
    return;
  }
  StartGeneration(w, req->gen, /*chat=*/true);
}

void Engine::HandleTokenize(const std::shared_ptr<http::ResponseWriter>& w) {
  if (!ServesNow(w)) return;
  auto req = ParseTokenizeRequest(w->request().body);
  if (!req.ok()) {
    SendError(w, 400, req.error().message(), "invalid_request_error");
    return;
  }
  std::vector<int32_t> ids;
  if (req->chat) {
    auto chat_ids = ChatIds(*text_, *req->chat);
    if (!chat_ids.ok()) {
      SendError(w, 400, chat_ids.error().message(), "invalid_request_error");
      return;
    }
    ids = std::move(chat_ids).value();
  } else {
    ids = text_->Encode(req->prompt, req->add_special_tokens);
  }
  w->Send(http::HttpResponse::Json(200, TokenizeJson(ids, runner_->dims().max_pos)));
}

void Engine::HandleDetokenize(const std::shared_ptr<http::ResponseWriter>& w) {
  if (!ServesNow(w)) return;
  auto ids = ParseDetokenizeRequest(w->request().body, runner_->dims().vocab);
  if (!ids.ok()) {
    SendError(w, 400, ids.error().message(), "invalid_request_error");
    return;
  }
  w->Send(http::HttpResponse::Json(200, DetokenizeJson(text_->Decode(*ids, /*skip_special_tokens=*/false))));
}

}  // namespace wsup::engine
