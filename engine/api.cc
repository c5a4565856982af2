#include "engine/api.h"

#include <cmath>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "common/json_limits.h"

namespace wsup::engine {

namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

const char* TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "a list";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a non-integer number";
    default: return "an integer";
  }
}

Error Bad(const std::string& m) { return InvalidArgument(m); }

// An integer field: absent or null keeps *out.
Status GetInt(const json& j, const char* key, int64_t lo, int64_t hi, int64_t* out, const std::string& hint) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number_integer()) {
    return Bad(std::string("'") + key + "' must be an integer, got " + TypeName(*it) + "; " + hint);
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return Bad(std::string("'") + key + "' is too large; " + hint);
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) {
    return Bad(std::string("'") + key + "' is " + std::to_string(v) + "; " + hint);
  }
  *out = v;
  return Status::Ok();
}

Status GetBool(const json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return Bad(std::string("'") + key + "' must be true or false, got " + TypeName(*it));
  *out = it->get<bool>();
  return Status::Ok();
}

// Options that would change the answer in ways this engine does not
// implement are refused unless they carry their neutral value.
Status CheckNeutral(const json& j) {
  auto neutral_num = [&](const char* key, double neutral) -> Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return Status::Ok();
    if (!it->is_number() || it->get<double>() != neutral) {
      return Bad(std::string("'") + key + "' is not supported by this engine; omit it or send " +
                 (neutral == 1 ? "1" : "0"));
    }
    return Status::Ok();
  };
  WSUP_RETURN_IF_ERROR(neutral_num("n", 1));
  WSUP_RETURN_IF_ERROR(neutral_num("best_of", 1));
  WSUP_RETURN_IF_ERROR(neutral_num("top_p", 1));
  WSUP_RETURN_IF_ERROR(neutral_num("presence_penalty", 0));
  WSUP_RETURN_IF_ERROR(neutral_num("frequency_penalty", 0));
  for (const char* key : {"stop", "suffix", "logprobs", "logit_bias"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if ((it->is_array() || it->is_object() || it->is_string()) && it->empty()) continue;
    if (it->is_boolean() && !it->get<bool>()) continue;
    return Bad(std::string("'") + key + "' is not supported by this engine; omit it");
  }
  auto echo = j.find("echo");
  if (echo != j.end() && !echo->is_null() && !(echo->is_boolean() && !echo->get<bool>())) {
    return Bad("'echo' is not supported by this engine; omit it or send false");
  }
  return Status::Ok();
}

std::string DumpSafe(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// The body as a JSON object, bounded before it is parsed; `example` is
// what to send instead.
Result<json> ParseBody(std::string_view body, const std::string& example) {
  Status bounded = CheckJsonLimits(body, "the request body", example, SIZE_MAX);
  if (!bounded.ok()) return bounded.error();
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("the request body is not valid JSON; " + example);
  if (!j.is_object()) return Bad(std::string("the request body is ") + TypeName(j) + ", not a JSON object; " + example);
  return j;
}

// The prompt's length against the context, and the request's `key`
// (max_tokens) against the room left: r->max_tokens.
Status FitLength(const json& j, const char* key, const ApiLimits& limits, CompletionRequest* r) {
  const std::string k = key;
  if (r->prompt.empty()) return Bad("'prompt' is empty; send at least one character or token id");
  const int64_t plen = static_cast<int64_t>(r->prompt.size());
  if (plen >= limits.context) {
    return Bad("the prompt has " + std::to_string(plen) + " tokens; the model's context is " +
               std::to_string(limits.context) + " tokens, leaving no room to generate: shorten the prompt");
  }

  const int64_t room = limits.context - plen;
  int64_t max_tokens = 16;
  WSUP_RETURN_IF_ERROR(GetInt(j, key, 1, room, &max_tokens,
                              "with a prompt of " + std::to_string(plen) + " tokens and a context of " +
                                  std::to_string(limits.context) + ", send 1 to " + std::to_string(room)));
  if (max_tokens > room) {
    // The default (16) alone may not fit a long prompt.
    return Bad("the prompt has " + std::to_string(plen) + " tokens and the default " + k + " 16 would exceed the "
               "context of " + std::to_string(limits.context) + "; send " + k + " of at most " + std::to_string(room));
  }
  r->max_tokens = static_cast<int>(max_tokens);
  return Status::Ok();
}


// What generation takes besides the prompt and its length.
Status ParseOptions(const json& j, CompletionRequest* r) {
  if (auto t = j.find("temperature"); t != j.end() && !t->is_null()) {
    if (!t->is_number()) return Bad(std::string("'temperature' must be a number, got ") + TypeName(*t) + "; send 0 to 2");
    const double v = t->get<double>();
    if (!(std::isfinite(v) && v >= 0 && v <= 2)) {
      return Bad("'temperature' is " + DumpSafe(*t) + "; send 0 (greedy) to 2");
    }
    r->temperature = v;
  }
  if (auto s = j.find("seed"); s != j.end() && !s->is_null()) {
    if (!s->is_number_integer()) return Bad(std::string("'seed' must be an integer, got ") + TypeName(*s));
    r->seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  WSUP_RETURN_IF_ERROR(GetBool(j, "stream", &r->stream));
  WSUP_RETURN_IF_ERROR(GetBool(j, "return_token_ids", &r->return_token_ids));
  if (auto so = j.find("stream_options"); so != j.end() && !so->is_null()) {
    if (!so->is_object()) return Bad(std::string("'stream_options' must be an object, got ") + TypeName(*so));
    WSUP_RETURN_IF_ERROR(GetBool(*so, "include_usage", &r->include_usage));
  }
  if (auto m = j.find("model"); m != j.end() && !m->is_null()) {
    if (!m->is_string()) return Bad(std::string("'model' must be a string, got ") + TypeName(*m));
    r->model = m->get<std::string>();
  }
  return CheckNeutral(j);
}

}  // namespace

Result<CompletionRequest> ParseCompletionRequest(std::string_view body, const ApiLimits& limits) {
  const std::string example = R"(; send a JSON object such as {"prompt": "Hello", "max_tokens": 16})";
  // Deep input is refused before the parser (and every walk over what it
  // builds) recurses into it. The HTTP server already bounds the size.
  WSUP_ASSIGN_OR_RETURN(json j, ParseBody(body, example.substr(2)));

  CompletionRequest r;
  auto p = j.find("prompt");
  if (p == j.end() || p->is_null()) {
    return Bad("'prompt' is required: a string, or a list of token ids" + example);
  }
  if (p->is_string()) {
    const auto& text = p->get_ref<const std::string&>();
    r.prompt = limits.text ? limits.text->Encode(text, /*add_special_tokens=*/true) : EncodeBytes(text);
  } else if (p->is_array()) {
    for (const auto& v : *p) {
      if (v.is_string() || v.is_array()) {
        return Bad("'prompt' holds a list of prompts; this engine takes one prompt per request: send a string "
                   "or one list of token ids");
      }
      if (!v.is_number_integer()) {
        return Bad(std::string("'prompt' as a list must hold token ids (integers), found ") + TypeName(v));
      }
      const bool too_big = v.is_number_unsigned() ? v.get<uint64_t>() >= static_cast<uint64_t>(limits.vocab)
                                                  : (v.get<int64_t>() < 0 || v.get<int64_t>() >= limits.vocab);
      if (too_big) {
        return Bad("'prompt' holds token id " + DumpSafe(v) + ", outside the vocabulary [0, " +
                   std::to_string(limits.vocab) + ")");
      }
      r.prompt.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
  } else {
    return Bad(std::string("'prompt' must be a string or a list of token ids, got ") + TypeName(*p));
  }
  WSUP_RETURN_IF_ERROR(FitLength(j, "max_tokens", limits, &r));
  WSUP_RETURN_IF_ERROR(ParseOptions(j, &r));
  return r;
}

std::string CompletionJson(const CompletionText& c, const std::string& text, const std::vector<int32_t>& tokens,
                           const std::string& finish_reason, const std::vector<int32_t>* prompt_ids,
                           int64_t prompt_tokens) {
  json choice = {{"text", text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  if (prompt_ids) {
    choice["prompt_token_ids"] = *prompt_ids;
    choice["token_ids"] = tokens;
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  json j = {{"id", c.id},
            {"object", "text_completion"},
            {"created", c.created},
            {"model", c.model},
            {"choices", json::array({choice})},
            {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", n}, {"total_tokens", prompt_tokens + n}}}};
  return DumpSafe(j);
}

std::string StreamChunkJson(const CompletionText& c, const std::string& text, const std::vector<int32_t>& tokens,
                            const std::string& finish_reason, bool token_ids, const std::vector<int32_t>* prompt_ids) {
  json choice = {{"text", text}, {"index", 0}, {"logprobs", nullptr}};
  choice["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  if (prompt_ids) choice["prompt_token_ids"] = *prompt_ids;
  if (token_ids) choice["token_ids"] = tokens;
  json j = {{"id", c.id},
            {"object", "text_completion"},
            {"created", c.created},
            {"model", c.model},
            {"choices", json::array({choice})}};
  return DumpSafe(j);
}

std::string UsageChunkJson(const CompletionText& c, int64_t prompt_tokens, int64_t completion_tokens) {
  json j = {{"id", c.id},
            {"object", "text_completion"},
            {"created", c.created},
            {"model", c.model},
            {"choices", json::array()},
            {"usage",
             {{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens}}}};
  return DumpSafe(j);
}

namespace {

// A message's content as the template sees it: a string (a list of text
// parts joined by newlines, as vLLM's "string" content format does).
Status NormalizeContent(ojson* m, size_t i) {
  auto c = m->find("content");
  if (c == m->end() || c->is_null() || c->is_string()) return Status::Ok();
  const std::string where = "'messages[" + std::to_string(i) + "].content'";
  if (!c->is_array()) return Bad(where + " must be a string, null or a list of text parts");
  std::string joined;
  for (size_t k = 0; k < c->size(); ++k) {
    const ojson& part = (*c)[k];
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
      return Bad(where + "[" + std::to_string(k) +
                 "] is not a text part ({\"type\": \"text\", \"text\": \"...\"}); this engine reads text only");
    }
    joined += (k ? "\n" : "") + part["text"].get<std::string>();
  }
  *c = joined;
  return Status::Ok();
}

// The chat's fields, shared by /v1/chat/completions and /tokenize.
Result<ChatRequest> ParseChatFields(const json& j) {
  const std::string example =
      R"(send {"messages": [{"role": "user", "content": "Hello"}]})";
  ChatRequest r;
  auto m = j.find("messages");
  if (m == j.end() || !m->is_array() || m->empty()) {
    return Bad("'messages' is required: a non-empty list of {\"role\", \"content\"} objects; " + example);
  }
  // Kept in order: the template sees each message's keys as the client sent them.
  r.messages = ojson::parse(m->dump(-1, ' ', false, json::error_handler_t::replace));
  for (size_t i = 0; i < r.messages.size(); ++i) {
    ojson& msg = r.messages[i];
    const std::string where = "'messages[" + std::to_string(i) + "]'";
    if (!msg.is_object()) return Bad(where + " must be an object with 'role' and 'content'; " + example);
    if (!msg.contains("role") || !msg["role"].is_string()) return Bad(where + " needs a 'role' string; " + example);
    WSUP_RETURN_IF_ERROR(NormalizeContent(&msg, i));
  }
  WSUP_RETURN_IF_ERROR(GetBool(j, "add_generation_prompt", &r.add_generation_prompt));
  WSUP_RETURN_IF_ERROR(GetBool(j, "add_special_tokens", &r.add_special_tokens));
  bool cont = false;
  WSUP_RETURN_IF_ERROR(GetBool(j, "continue_final_message", &cont));
  if (cont) return Bad("'continue_final_message' is not supported by this engine; omit it or send false");
  if (auto t = j.find("tools"); t != j.end() && !t->is_null()) {
    if (!t->is_array()) return Bad("'tools' must be a list of tool definitions");
    r.extra["tools"] = ojson::parse(t->dump(-1, ' ', false, json::error_handler_t::replace));
  }
  if (auto k = j.find("chat_template_kwargs"); k != j.end() && !k->is_null()) {
    if (!k->is_object()) return Bad("'chat_template_kwargs' must be an object of the template's variables");
    for (const auto& [key, v] : k->items()) {
      if (key == "messages" || key == "add_generation_prompt") {
        return Bad("'chat_template_kwargs' may not set '" + key + "': send it as the request's own field");
      }
      r.extra[key] = ojson::parse(v.dump(-1, ' ', false, json::error_handler_t::replace));
    }
  }
  return r;
}

}  // namespace

Result<ChatRequest> ParseChatRequest(std::string_view body) {
  const std::string example = R"(send a JSON object such as {"messages": [{"role": "user", "content": "Hello"}]})";
  WSUP_ASSIGN_OR_RETURN(json j, ParseBody(body, example));
  WSUP_ASSIGN_OR_RETURN(ChatRequest r, ParseChatFields(j));
  if (auto tc = j.find("tool_choice"); tc != j.end() && !tc->is_null()) {
    if (!(tc->is_string() && (*tc == "none" || *tc == "auto"))) {
      return Bad("'tool_choice' " + DumpSafe(*tc) + " is not supported by this engine; omit it or send \"none\" or "
                 "\"auto\"");
    }
  }
  if (auto rf = j.find("response_format"); rf != j.end() && !rf->is_null()) {
    if (!(rf->is_object() && rf->value("type", "") == "text")) {
      return Bad("'response_format' other than {\"type\": \"text\"} is not supported by this engine; omit it");
    }
  }
  if (auto tl = j.find("top_logprobs"); tl != j.end() && !tl->is_null() && !(tl->is_number_integer() && *tl == 0)) {
    return Bad("'top_logprobs' is not supported by this engine; omit it");
  }
  WSUP_RETURN_IF_ERROR(ParseOptions(j, &r.gen));
  r.body = std::move(j);
  return r;
}

Status FitChatPrompt(std::vector<int32_t> prompt, const ApiLimits& limits, ChatRequest* r) {
  r->gen.prompt = std::move(prompt);
  const bool newer = r->body.contains("max_completion_tokens") && !r->body["max_completion_tokens"].is_null();
  return FitLength(r->body, newer ? "max_completion_tokens" : "max_tokens", limits, &r->gen);
}

namespace {

json ChatEnvelope(const CompletionText& c, const char* object) {
  return {{"id", c.id}, {"object", object}, {"created", c.created}, {"model", c.model}};
}

}  // namespace

std::string ChatCompletionJson(const CompletionText& c, const std::string& text, const std::vector<int32_t>& tokens,
                               const std::string& finish_reason, const std::vector<int32_t>* prompt_ids,
                               int64_t prompt_tokens) {
  json choice = {{"index", 0},
                 {"message", {{"role", "assistant"}, {"content", text}}},
                 {"logprobs", nullptr},
                 {"finish_reason", finish_reason}};
  if (prompt_ids) choice["token_ids"] = tokens;
  json j = ChatEnvelope(c, "chat.completion");
  j["choices"] = json::array({choice});
  const int64_t n = static_cast<int64_t>(tokens.size());
  j["usage"] = {{"prompt_tokens", prompt_tokens}, {"completion_tokens", n}, {"total_tokens", prompt_tokens + n}};
  if (prompt_ids) j["prompt_token_ids"] = *prompt_ids;
  return DumpSafe(j);
}

std::string ChatRoleChunkJson(const CompletionText& c, const std::vector<int32_t>* prompt_ids) {
  json j = ChatEnvelope(c, "chat.completion.chunk");
  j["choices"] = json::array(
      {{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
  if (prompt_ids) j["prompt_token_ids"] = *prompt_ids;
  return DumpSafe(j);
}

std::string ChatChunkJson(const CompletionText& c, const std::string& text, const std::vector<int32_t>& tokens,
                          const std::string& finish_reason, bool token_ids) {
  json choice = {{"index", 0}, {"delta", {{"content", text}}}, {"logprobs", nullptr}};
  choice["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  if (token_ids) choice["token_ids"] = tokens;
  json j = ChatEnvelope(c, "chat.completion.chunk");
  j["choices"] = json::array({choice});
  return DumpSafe(j);
}

std::string ChatUsageChunkJson(const CompletionText& c, int64_t prompt_tokens, int64_t completion_tokens) {
  json j = ChatEnvelope(c, "chat.completion.chunk");
  j["choices"] = json::array();
  j["usage"] = {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens}};
  return DumpSafe(j);
}

Result<TokenizeRequest> ParseTokenizeRequest(std::string_view body) {
  const std::string example = R"(send a JSON object such as {"prompt": "Hello", "add_special_tokens": true})";
  WSUP_ASSIGN_OR_RETURN(json j, ParseBody(body, example));
  TokenizeRequest r;
  auto p = j.find("prompt");
  if (p == j.end() || p->is_null()) {
    if (j.contains("messages")) {
      WSUP_ASSIGN_OR_RETURN(ChatRequest chat, ParseChatFields(j));
      r.add_special_tokens = chat.add_special_tokens;
      r.chat = std::move(chat);
      return r;
    }
    return Bad("'prompt' is required (or 'messages'); " + example);
  }
  if (!p->is_string()) return Bad(std::string("'prompt' must be a string, got ") + TypeName(*p) + "; " + example);
  r.prompt = p->get<std::string>();
  WSUP_RETURN_IF_ERROR(GetBool(j, "add_special_tokens", &r.add_special_tokens));
  return r;
}

std::string TokenizeJson(const std::vector<int32_t>& ids, int64_t max_model_len) {
  json j = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", max_model_len}};
  return DumpSafe(j);
}

Result<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body, int64_t vocab) {
  const std::string example = R"(send a JSON object such as {"tokens": [9906, 11]})";
  WSUP_ASSIGN_OR_RETURN(json j, ParseBody(body, example));
  auto t = j.find("tokens");
  if (t == j.end() || !t->is_array()) {
    return Bad("'tokens' is required: a list of token ids; " + example);
  }
  std::vector<int32_t> ids;
  ids.reserve(t->size());
  for (const auto& v : *t) {
    if (!v.is_number_integer()) return Bad(std::string("'tokens' must hold token ids (integers), found ") + TypeName(v));
    const bool out = v.is_number_unsigned() ? v.get<uint64_t>() >= static_cast<uint64_t>(vocab)
                                            : (v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab);
    if (out) {
      return Bad("'tokens' holds token id " + DumpSafe(v) + ", outside the vocabulary [0, " + std::to_string(vocab) +
                 ")");
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

std::string DetokenizeJson(const std::string& text) { return DumpSafe(json{{"prompt", text}}); }

}  // namespace wsup::engine
