// Fuzzes chat templates (text/jinja.h), which come from a checkpoint's
// files: the parse of arbitrary template text, then a render of what
// parses with a small chat. Neither may crash, hang (a render is bounded in
// steps and size), or read out of bounds; the chat request parsers of the
// engine take the same input as a body.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "engine/api.h"
#include "text/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view src(reinterpret_cast<const char*>(data), size);
  auto tmpl = wsup::text::jinja::Template::Parse(src, "fuzz");
  if (tmpl.ok()) {
    static const nlohmann::ordered_json vars = {
        {"messages",
         {{{"role", "system"}, {"content", "Be brief."}},
          {{"role", "user"}, {"content", "Hi \xe6\x97\xa5 {{ x }}"}},
          {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {{{"function", {{"name", "f"}, {"arguments", "{}"}}}}}}}}},
        {"add_generation_prompt", true},
        {"bos_token", "<s>"},
        {"eos_token", "</s>"},
        {"tools", nullptr}};
    auto out = tmpl->Render(vars);
    (void)out;
  }
  (void)wsup::engine::ParseChatRequest(src);
  (void)wsup::engine::ParseTokenizeRequest(src);
  (void)wsup::engine::ParseDetokenizeRequest(src, 1000);
  return 0;
}
