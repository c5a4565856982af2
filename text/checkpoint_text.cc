#include "text/checkpoint_text.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/json_limits.h"

namespace wsup::text {

namespace {

using nlohmann::json;

constexpr size_t kMaxTemplateBytes = size_t{1} << 20;

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// A special token as tokenizer_config.json writes it: a string, an
// AddedToken object ({"content": ...}), or null.
Result<std::optional<std::string>> TokenField(const json& cfg, const char* key, const std::string& file) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return std::optional<std::string>(c->get<std::string>());
  }
  return InvalidArgument(file + ": '" + key +
                         "' must be a token's text or an AddedToken object with a 'content' string; fix the file");
}

Result<std::optional<bool>> BoolField(const json& cfg, const char* key, const std::string& file) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean()) return InvalidArgument(file + ": '" + key + "' must be true or false; fix the file");
  return std::optional<bool>(it->get<bool>());
}

// The classes whose transformers implementation makes the post-processor
// from add_bos_token and add_eos_token (checkpoint_text.h).
bool RebuildsPostProcessor(const std::string& cls) {
  for (const char* c : {"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer", "CodeLlamaTokenizerFast",
                        "GemmaTokenizer", "GemmaTokenizerFast"}) {
    if (cls == c) return true;
  }
  return false;
}

}  // namespace

Result<std::unique_ptr<CheckpointText>> CheckpointText::Load(const std::string& dir) {
  const std::string json_path = JoinPath(dir, "tokenizer.json");
  if (!Exists(json_path)) {
    if (Exists(JoinPath(dir, "tokenizer.model"))) {
      return Error(Code::kRefused, JoinPath(dir, "tokenizer.model") +
                                       ": a SentencePiece model without tokenizer.json is not supported; write the "
                                       "checkpoint's tokenizer.json beside it (transformers' "
                                       "AutoTokenizer.from_pretrained(dir).save_pretrained(dir) does)");
    }
    return std::unique_ptr<CheckpointText>();
  }
  auto tok = Tokenizer::Load(json_path);
  if (!tok.ok()) return tok.error();
  std::unique_ptr<CheckpointText> t(new CheckpointText());
  t->tokenizer_ = std::move(tok).value();

  const std::string cfg_path = JoinPath(dir, "tokenizer_config.json");
  const std::string jinja_path = JoinPath(dir, "chat_template.jinja");
  if (Exists(jinja_path)) {
    auto src = ReadFile(jinja_path, kMaxTemplateBytes);
    if (!src.ok()) return src.error();
    WSUP_RETURN_IF_ERROR(t->SetChatTemplate(*src, jinja_path));
  }
  if (!Exists(cfg_path)) return t;
  auto text = ReadFile(cfg_path);
  if (!text.ok()) return text.error();
  auto parsed = ParseJsonChecked(*text, cfg_path, "fix the file or remove it");
  if (!parsed.ok()) return parsed.error();
  const json& cfg = *parsed;
  if (!cfg.is_object()) return InvalidArgument(cfg_path + " is not a JSON object; fix the file or remove it");
  if (auto c = cfg.find("tokenizer_class"); c != cfg.end() && c->is_string()) t->class_ = c->get<std::string>();

  std::optional<std::string> bos, eos;
  WSUP_ASSIGN_OR_RETURN(bos, TokenField(cfg, "bos_token", cfg_path));
  WSUP_ASSIGN_OR_RETURN(eos, TokenField(cfg, "eos_token", cfg_path));
  if (bos) t->bos_id_ = t->tokenizer_->TokenToId(*bos);
  if (eos) t->eos_id_ = t->tokenizer_->TokenToId(*eos);
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    std::optional<std::string> v;
    WSUP_ASSIGN_OR_RETURN(v, TokenField(cfg, key, cfg_path));
    if (v) t->special_vars_[key] = *v;
  }
  if (!t->chat_) {
    auto ct = cfg.find("chat_template");
    if (ct != cfg.end() && ct->is_string()) {
      WSUP_RETURN_IF_ERROR(t->SetChatTemplate(ct->get<std::string>(), cfg_path + " chat_template"));
    } else if (ct != cfg.end() && ct->is_array()) {
      // Named templates: the default one serves chats.
      bool found = false;
      for (const auto& named : *ct) {
        if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
            named["template"].is_string()) {
          WSUP_RETURN_IF_ERROR(t->SetChatTemplate(named["template"].get<std::string>(),
                                                  cfg_path + " chat_template 'default'"));
          found = true;
        }
      }
      if (!found) {
        return InvalidArgument(cfg_path + ": 'chat_template' is a list with no template named \"default\"; name "
                               "the chat template \"default\"");
      }
    } else if (ct != cfg.end() && !ct->is_null()) {
      return InvalidArgument(cfg_path + ": 'chat_template' must be a string or a list of {name, template}; fix the file");
    }
  }

  if (RebuildsPostProcessor(t->class_)) {
    std::optional<bool> add_bos, add_eos;
    WSUP_ASSIGN_OR_RETURN(add_bos, BoolField(cfg, "add_bos_token", cfg_path));
    WSUP_ASSIGN_OR_RETURN(add_eos, BoolField(cfg, "add_eos_token", cfg_path));
    // transformers' defaults for these classes: a BOS, no EOS.
    const bool want_bos = add_bos.value_or(true), want_eos = add_eos.value_or(false);
    auto need = [&](bool want, const std::optional<std::string>& tok, const std::optional<int32_t>& id,
                    const char* key, std::vector<int32_t>* out) -> Status {
      if (!want) return Status::Ok();
      if (!tok || !id) {
        return InvalidArgument(cfg_path + ": add_" + std::string(key) + " is true but '" + key + "' " +
                               (tok ? "is not a token of tokenizer.json" : "is not set") +
                               "; set it to one of the file's tokens, or set add_" + key + " to false");
      }
      out->push_back(*id);
      return Status::Ok();
    };
    WSUP_RETURN_IF_ERROR(need(want_bos, bos, t->bos_id_, "bos_token", &t->prefix_));
    WSUP_RETURN_IF_ERROR(need(want_eos, eos, t->eos_id_, "eos_token", &t->suffix_));
    t->own_specials_ = true;
  }
  return t;
}

Status CheckpointText::SetChatTemplate(const std::string& source, const std::string& name) {
  auto parsed = jinja::Template::Parse(source, name);
  if (!parsed.ok()) return parsed.error();
  chat_ = std::make_unique<jinja::Template>(std::move(parsed).value());
  chat_source_ = name;
  return Status::Ok();
}

Result<std::string> CheckpointText::RenderChat(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                               const nlohmann::ordered_json& extra) const {
  if (!chat_) {
    return Error(Code::kRefused, "the model has no chat template (no chat_template.jinja, and no chat_template in "
                                 "tokenizer_config.json); send a completion with a prompt instead");
  }
  nlohmann::ordered_json vars = {{"messages", messages}, {"tools", nullptr}, {"add_generation_prompt", add_generation_prompt}};
  for (const auto& [k, v] : special_vars_.items()) vars[k] = v;
  if (extra.is_object()) {
    for (const auto& [k, v] : extra.items()) vars[k] = v;
  }
  return chat_->Render(vars);
}

std::vector<int32_t> CheckpointText::Encode(std::string_view text, bool add_special_tokens) const {
  if (!own_specials_) return tokenizer_->Encode(text, add_special_tokens);
  std::vector<int32_t> ids = tokenizer_->Encode(text, false);
  if (!add_special_tokens) return ids;
  std::vector<int32_t> out;
  out.reserve(prefix_.size() + ids.size() + suffix_.size());
  out.insert(out.end(), prefix_.begin(), prefix_.end());
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

std::string CheckpointText::Describe() const {
  std::string d = "tokenizer.json (" + tokenizer_->Describe() + ")";
  if (!class_.empty()) d += ", " + class_;
  return d;
}

}  // namespace wsup::text
