#include "front/completion.h"

#include <cstdint>

#include "common/json_limits.h"

namespace wsup::front {

using nlohmann::ordered_json;

namespace {

std::string Dump(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

}  // namespace

bool MayRequestStream(std::string_view body) { return body.find("\"stream\"") != std::string_view::npos; }

Status CheckCompletionBody(std::string_view body) {
  return CheckJsonLimits(body, "the request body",
                         R"(send a JSON object such as {"prompt": "Hello", "max_tokens": 16})", SIZE_MAX);
}

namespace {

// The plan from a body within the JSON limits (checked by the caller: never
// parse past them, as copying or dumping a deep tree recurses once per level).
// A chat's fields that a token-id completion does not take (its
// continuation is one): what they asked for is in the prompt's ids.
constexpr const char* kChatOnly[] = {"messages", "tools", "tool_choice", "chat_template_kwargs",
                                     "add_generation_prompt", "continue_final_message", "response_format",
                                     "parallel_tool_calls", "max_completion_tokens", "chat_template",
                                     "documents", "top_logprobs", "add_special_tokens"};

bool PlanChecked(std::string_view body, int64_t default_max_tokens, CompletionPlan* plan, bool chat) {
  ordered_json j = ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto stream = j.find("stream");
  plan->stream = stream != j.end() && stream->is_boolean() && stream->get<bool>();
  if (!plan->stream) {
    plan->upstream_body = std::string(body);
    return true;
  }
  plan->chat = chat;
  auto wants = j.find("return_token_ids");
  plan->client_wants_token_ids = wants != j.end() && wants->is_boolean() && wants->get<bool>();

  auto fail = [&](std::string why) {
    plan->resumable = false;
    plan->not_resumable = std::move(why);
  };
  plan->resumable = true;
  // A value the engine refuses must reach it as the client sent it: turning
  // it into `true` for the resume would accept on a stream what a plain
  // request is refused for.
  if (wants != j.end() && !wants->is_boolean() && !wants->is_null()) fail("return_token_ids is not a boolean");
  auto prompt = j.find("prompt");
  if (chat) {
    auto m = j.find("messages");
    if (m == j.end() || !m->is_array() || m->empty()) fail("no messages");
    // A logprobs answer cannot be continued as a completion's.
    auto lp = j.find("logprobs");
    if (lp != j.end() && !(lp->is_boolean() && !lp->get<bool>()) && !lp->is_null()) fail("'logprobs' is asked for");
  } else if (prompt == j.end()) {
    fail("no prompt");
  } else if (prompt->is_string()) {
    // The engine reports its ids (prompt_token_ids): never guessed here.
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number_integer()) {
    plan->prompt_ids_given = true;
    for (const auto& t : *prompt) {
      if (!t.is_number_integer()) {
        fail("prompt mixes token ids and other values");
        break;
      }
      plan->prompt_ids.push_back(t.get<int64_t>());
    }
  } else {
    fail("prompt is neither a string nor a list of token ids (batched prompts are not resumed)");
  }
  for (const char* key : {"n", "best_of"}) {
    auto it = j.find(key);
    if (it != j.end() && !(it->is_number_integer() && it->get<int64_t>() == 1) && !it->is_null()) {
      fail(std::string("'") + key + "' asks for several choices");
    }
  }
  auto echo = j.find("echo");
  if (echo != j.end() && echo->is_boolean() && echo->get<bool>()) fail("'echo' would repeat the prompt");

  auto max_tokens = j.find("max_tokens");
  if (auto newer = j.find("max_completion_tokens"); chat && newer != j.end() && !newer->is_null()) {
    max_tokens = newer;  // a chat's newer name wins, as in the engines
  }
  if (max_tokens == j.end() || max_tokens->is_null()) {
    plan->max_tokens = default_max_tokens;
    j["max_tokens"] = default_max_tokens;
  } else if (max_tokens->is_number_integer()) {
    plan->max_tokens = max_tokens->get<int64_t>();
  } else {
    fail("max_tokens is not an integer");
  }
  // Only a resumable stream needs token ids; otherwise the client gets
  // exactly what it asked for.
  if (plan->resumable) j["return_token_ids"] = true;
  plan->upstream_body = Dump(j);
  plan->request = std::move(j);
  return true;
}

}  // namespace

bool PlanCompletion(std::string_view body, int64_t default_max_tokens, CompletionPlan* plan, bool chat) {
  *plan = CompletionPlan();
  if (!CheckCompletionBody(body).ok()) return false;
  return PlanChecked(body, default_max_tokens, plan, chat);
}

Status ReadCompletion(std::string_view body, int64_t default_max_tokens, CompletionPlan* plan, bool chat) {
  *plan = CompletionPlan();
  WSUP_RETURN_IF_ERROR(CheckCompletionBody(body));
  // A completion that cannot ask for a stream costs no parse at all.
  if (!MayRequestStream(body)) return Status::Ok();
  if (!PlanChecked(body, default_max_tokens, plan, chat)) *plan = CompletionPlan();
  return Status::Ok();
}

std::string ResumeBody(const CompletionPlan& plan, const std::vector<int64_t>& prompt_ids,
                       const std::vector<int64_t>& delivered, int64_t remaining) {
  ordered_json j = plan.request;
  if (plan.chat) {
    // A token-id completion (kResumeTarget) of the chat's prompt ids.
    for (const char* key : kChatOnly) j.erase(key);
    auto lp = j.find("logprobs");
    if (lp != j.end()) j.erase(lp);
  }
  // Nothing delivered and the prompt's ids not known: the prompt as the
  // client sent it is the exact continuation (the engine tokenizes it).
  if (!prompt_ids.empty() || !delivered.empty()) {
    ordered_json ids = ordered_json::array();
    for (int64_t t : prompt_ids) ids.push_back(t);
    for (int64_t t : delivered) ids.push_back(t);
    j["prompt"] = std::move(ids);
  }
  j["max_tokens"] = remaining;
  j["return_token_ids"] = true;
  j["stream"] = true;
  auto temp = j.find("temperature");
  bool sampling = temp != j.end() && temp->is_number() && temp->get<double>() > 0;
  auto seed = j.find("seed");
  if (sampling && seed != j.end() && seed->is_number_integer()) {
    // A different, reproducible seed for the continuation: replaying the
    // original seed would draw the same random numbers for other positions.
    uint64_t s = static_cast<uint64_t>(seed->get<int64_t>());
    s = s * 0x9E3779B97F4A7C15ull + delivered.size();
    *seed = static_cast<int64_t>(s & 0x7fffffffffffull);
  }
  return Dump(j);
}

}  // namespace wsup::front
