#include "engine/api.h"

#include <cmath>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "common/json_limits.h"

namespace wsup::engine {

namespace {

using nlohmann::json;

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
  if (r.prompt.empty()) return Bad("'prompt' is empty; send at least one character or token id");
  const int64_t plen = static_cast<int64_t>(r.prompt.size());
  if (plen >= limits.context) {
    return Bad("the prompt has " + std::to_string(plen) + " tokens; the model's context is " +
               std::to_string(limits.context) + " tokens, leaving no room to generate: shorten the prompt");
  }

  const int64_t room = limits.context - plen;
  int64_t max_tokens = 16;
  WSUP_RETURN_IF_ERROR(GetInt(j, "max_tokens", 1, room, &max_tokens,
                              "with a prompt of " + std::to_string(plen) + " tokens and a context of " +
                                  std::to_string(limits.context) + ", send 1 to " + std::to_string(room)));
  if (max_tokens > room) {
    // The default (16) alone may not fit a long prompt.
    return Bad("the prompt has " + std::to_string(plen) + " tokens and the default max_tokens 16 would exceed the "
               "context of " + std::to_string(limits.context) + "; send max_tokens of at most " + std::to_string(room));
  }
  r.max_tokens = static_cast<int>(max_tokens);

  if (auto t = j.find("temperature"); t != j.end() && !t->is_null()) {
    if (!t->is_number()) return Bad(std::string("'temperature' must be a number, got ") + TypeName(*t) + "; send 0 to 2");
    const double v = t->get<double>();
    if (!(std::isfinite(v) && v >= 0 && v <= 2)) {
      return Bad("'temperature' is " + DumpSafe(*t) + "; send 0 (greedy) to 2");
    }
    r.temperature = v;
  }
  if (auto s = j.find("seed"); s != j.end() && !s->is_null()) {
    if (!s->is_number_integer()) return Bad(std::string("'seed' must be an integer, got ") + TypeName(*s));
    r.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  WSUP_RETURN_IF_ERROR(GetBool(j, "stream", &r.stream));
  WSUP_RETURN_IF_ERROR(GetBool(j, "return_token_ids", &r.return_token_ids));
  if (auto so = j.find("stream_options"); so != j.end() && !so->is_null()) {
    if (!so->is_object()) return Bad(std::string("'stream_options' must be an object, got ") + TypeName(*so));
    WSUP_RETURN_IF_ERROR(GetBool(*so, "include_usage", &r.include_usage));
  }
  if (auto m = j.find("model"); m != j.end() && !m->is_null()) {
    if (!m->is_string()) return Bad(std::string("'model' must be a string, got ") + TypeName(*m));
    r.model = m->get<std::string>();
  }
  WSUP_RETURN_IF_ERROR(CheckNeutral(j));
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

Result<TokenizeRequest> ParseTokenizeRequest(std::string_view body) {
  const std::string example = R"(send a JSON object such as {"prompt": "Hello", "add_special_tokens": true})";
  WSUP_ASSIGN_OR_RETURN(json j, ParseBody(body, example));
  TokenizeRequest r;
  auto p = j.find("prompt");
  if (p == j.end() || p->is_null()) {
    if (j.contains("messages")) {
      return Bad("'messages' (a chat) needs the model's chat template, which this engine does not render yet; "
                 "send 'prompt' with the text to tokenize");
    }
    return Bad("'prompt' is required; " + example);
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
