#include "front/sse_relay.h"

#include <nlohmann/json.hpp>

#include "common/json_limits.h"

namespace wsup::front {

using nlohmann::ordered_json;

void CompletionStream::Feed(std::string_view data, std::string* out) {
  if (done_) return;  // nothing follows [DONE] in a well-formed stream
  if (passthrough_) {
    out->append(data);
    return;
  }
  buf_.append(data);
  size_t start = 0;  // first byte of the event being gathered
  size_t line = 0;   // first byte of the next line to look at
  for (;;) {
    size_t nl = buf_.find('\n', line);
    if (nl == std::string::npos) break;
    size_t line_start = line;
    bool blank = nl == line_start || (nl == line_start + 1 && buf_[line_start] == '\r');
    line = nl + 1;
    if (!blank) continue;
    if (line_start == start) {
      out->append(buf_, start, line - start);  // a blank line with no event before it
    } else {
      OnEvent(std::string_view(buf_).substr(start, line - start), out);
    }
    start = line;
    if (done_) break;
  }
  buf_.erase(0, start);
  if (buf_.size() > kMaxEventBytes) {
    trackable_ = false;
    passthrough_ = true;
    out->append(buf_);
    buf_.clear();
  }
}

void CompletionStream::OnEvent(std::string_view raw, std::string* out) {
  ++events_;
  // Gather the data lines ("data:" plus an optional space); other fields
  // (comments, event:, id:) are kept as they are.
  std::string payload;
  int data_lines = 0;
  size_t pos = 0;
  while (pos < raw.size()) {
    size_t nl = raw.find('\n', pos);
    if (nl == std::string_view::npos) nl = raw.size();
    std::string_view l = raw.substr(pos, nl - pos);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (l.substr(0, 5) == "data:") {
      l.remove_prefix(5);
      if (!l.empty() && l.front() == ' ') l.remove_prefix(1);
      if (data_lines++ > 0) payload += '\n';
      payload.append(l);
    }
    pos = nl + 1;
  }
  if (data_lines == 0) {
    out->append(raw);
    return;
  }
  if (payload == "[DONE]") {
    done_ = true;
    out->append(raw);
    return;
  }
  // An event past the shared JSON limits is passed on unparsed, like one
  // that is not JSON: rewriting it would walk its whole depth.
  ordered_json j;
  if (CheckJsonLimits(payload, "an engine event", "", kMaxEventBytes).ok()) {
    j = ordered_json::parse(payload, nullptr, /*allow_exceptions=*/false);
  } else {
    j = ordered_json(ordered_json::value_t::discarded);
  }
  if (j.is_discarded() || !j.is_object()) {
    trackable_ = false;
    out->append(raw);
    return;
  }
  bool changed = false;
  if (j.contains("error")) error_seen_ = true;
  if (chat_ && continuation_) {
    auto object = j.find("object");
    if (object != j.end() && *object == "text_completion") {
      ToChatChunk(&j);
      changed = true;
    } else if (auto ch = j.find("choices"); ch != j.end() && ch->is_array() && ch->size() == 1 &&
                                            (*ch)[0].is_object() && (*ch)[0].contains("delta") &&
                                            (*ch)[0]["delta"].is_object() && (*ch)[0]["delta"].contains("role") &&
                                            !(*ch)[0].contains("token_ids") &&
                                            (*ch)[0]["delta"].value("content", std::string()).empty()) {
      return;  // the role again, from a chat sent again whole: the client has it
    }
  }
  auto id = j.find("id");
  if (id != j.end() && id->is_string()) {
    if (first_id_.empty()) {
      first_id_ = id->get<std::string>();
    } else if (continuation_ && id->get_ref<const std::string&>() != first_id_) {
      *id = first_id_;
      changed = true;
    }
  }
  // The prompt's ids: a chat chunk carries them at the top, a completion
  // chunk in its choice. Only the first stream's count; a continuation's
  // are that prompt plus the tokens already delivered.
  auto take_prompt = [&](ordered_json& holder) {
    auto p = holder.find("prompt_token_ids");
    if (p == holder.end()) return;
    if (!continuation_ && !prompt_reported_ && p->is_array()) {
      std::vector<int64_t> ids;
      bool ok = true;
      for (const auto& t : *p) {
        ok = ok && t.is_number_integer();
        if (ok) ids.push_back(t.get<int64_t>());
      }
      if (ok && !ids.empty()) {
        prompt_ids_ = std::move(ids);
        prompt_reported_ = true;
      }
    }
    if (strip_ || continuation_) {
      holder.erase(p);
      changed = true;
    }
  };
  take_prompt(j);
  auto choices = j.find("choices");
  if (choices != j.end() && choices->is_array()) {
    for (auto& c : *choices) {
      if (!c.is_object()) continue;
      take_prompt(c);
      auto ids = c.find("token_ids");
      bool have_ids = false;
      if (ids != c.end() && ids->is_array()) {
        have_ids = true;
        for (const auto& t : *ids) {
          if (t.is_number_integer()) {
            delivered_.push_back(t.get<int64_t>());
          } else {
            trackable_ = false;
          }
        }
      }
      if (!have_ids) {
        // Text with no ids: what was delivered can no longer be told.
        const ordered_json* text = nullptr;
        if (auto t = c.find("text"); t != c.end()) text = &*t;
        if (auto d = c.find("delta"); d != c.end() && d->is_object()) {
          if (auto t = d->find("content"); t != d->end()) text = &*t;
        }
        if (text && text->is_string() && !text->get_ref<const std::string&>().empty()) trackable_ = false;
      }
      auto fr = c.find("finish_reason");
      if (fr != c.end() && !fr->is_null()) finished_ = true;
      if (strip_ && ids != c.end()) {
        c.erase(ids);
        changed = true;
      }
    }
  }
  if (continuation_ && resume_offset_ > 0) {
    auto usage = j.find("usage");
    if (usage != j.end() && usage->is_object()) {
      auto p = usage->find("prompt_tokens");
      auto ct = usage->find("completion_tokens");
      if (p != usage->end() && ct != usage->end() && p->is_number_integer() && ct->is_number_integer()) {
        auto off = static_cast<int64_t>(resume_offset_);
        *p = p->get<int64_t>() - off;
        *ct = ct->get<int64_t>() + off;
        changed = true;
      }
    }
  }
  if (!changed) {
    out->append(raw);
    return;
  }
  out->append("data: ");
  out->append(j.dump(-1, ' ', false, ordered_json::error_handler_t::replace));
  out->append("\n\n");
}

void CompletionStream::ToChatChunk(ordered_json* j) {
  (*j)["object"] = "chat.completion.chunk";
  auto choices = j->find("choices");
  if (choices == j->end() || !choices->is_array()) return;
  for (auto& c : *choices) {
    if (!c.is_object()) continue;
    ordered_json chat = {{"index", c.value("index", 0)},
                         {"delta", {{"content", c.value("text", std::string())}}},
                         {"logprobs", nullptr},
                         {"finish_reason", c.contains("finish_reason") ? c["finish_reason"] : ordered_json(nullptr)}};
    if (c.contains("token_ids")) chat["token_ids"] = c["token_ids"];
    if (c.contains("prompt_token_ids")) chat["prompt_token_ids"] = c["prompt_token_ids"];
    c = std::move(chat);
  }
}

void CompletionStream::BeginContinuation() {
  buf_.clear();
  continuation_ = true;
  resume_offset_ = delivered_.size();
}

std::string CompletionStream::SynthesizeEnd(std::string_view finish_reason) {
  std::string out;
  if (!finished_) {
    ordered_json ev;
    if (!first_id_.empty()) ev["id"] = first_id_;
    if (chat_) {
      ev["object"] = "chat.completion.chunk";
      ev["choices"] = ordered_json::array({ordered_json{
          {"index", 0}, {"delta", ordered_json::object()}, {"finish_reason", std::string(finish_reason)}}});
    } else {
      ev["object"] = "text_completion";
      ev["choices"] = ordered_json::array(
          {ordered_json{{"index", 0}, {"text", ""}, {"finish_reason", std::string(finish_reason)}}});
    }
    out += "data: " + ev.dump(-1, ' ', false, ordered_json::error_handler_t::replace) + "\n\n";
    finished_ = true;
  }
  out += "data: [DONE]\n\n";
  done_ = true;
  return out;
}

}  // namespace wsup::front
