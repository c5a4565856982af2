// wsup-engine on the real-tokenizer test checkpoints (testkit/tok_tiny.h)
// against transformers' goldens: a text prompt's ids and a chat's ids (the
// template and the tokenizer together) always; the greedy output and its
// text where the golden's top-1/top-2 margin leaves no doubt about it.
#include <chrono>
#include <csignal>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/engine/engine_fixture.h"
#include "testkit/tok_tiny.h"

using nlohmann::json;
using namespace std::chrono_literals;
using wsup::test::TempDir;


TEST_CASE("engine text: the real-tokenizer checkpoints give transformers' prompt ids and, where sure, its output") {
  for (const char* name : {"llama3", "qwen3", "deepseekv3"}) {
    DYNAMIC_SECTION(name) {
      TempDir dir;
      auto model = wsup::test::TokTinyCheckpoint(dir, name);
      INFO((model.ok() ? *model : model.error().message()));
      REQUIRE(model.ok());
      auto e = wsup::test::StartWithReadyFd({wsup::test::BinPath("wsup-engine"), "--model", *model, "--port", "0",
                                             "--ready-fd", "3", "--log-level", "warn", "--kv-cache-mib", "4"},
                                            dir.Join("engine.log"), 120s);
      INFO(e.Log());
      REQUIRE(e.ready);
      int exact = 0, cases = 0;
      for (bool chat : {false, true}) {
        for (const auto& c : wsup::test::TokTinyGoldens(name, chat)) {
          INFO((chat ? "chat " + c.rendered : "prompt " + c.prompt) << " (margin " << c.margin << ")");
          ++cases;
          // The prompt's ids: /tokenize, and what a completion reports.
          json t = chat ? wsup::test::PostJson(e.port, "/tokenize", {{"messages", c.messages}})
                        : wsup::test::PostJson(e.port, "/tokenize", {{"prompt", c.prompt}});
          CHECK(t["tokens"].get<std::vector<int32_t>>() == c.prompt_ids);
          json body = {{"max_tokens", 16}, {"temperature", 0}, {"return_token_ids", true}};
          if (chat) {
            body["messages"] = c.messages;
          } else {
            body["prompt"] = c.prompt;
          }
          json r = wsup::test::PostJson(e.port, chat ? "/v1/chat/completions" : "/v1/completions", body);
          const json& choice = r["choices"][0];
          CHECK((chat ? r["prompt_token_ids"] : choice["prompt_token_ids"]).get<std::vector<int32_t>>() ==
                c.prompt_ids);
          if (c.margin < wsup::test::kExactMargin) continue;
          ++exact;
          CHECK(choice["token_ids"].get<std::vector<int32_t>>() == c.output_ids);
          CHECK((chat ? choice["message"]["content"] : choice["text"]).get<std::string>() == c.output_text);
        }
      }
      CHECK(cases == 10);
      CHECK(exact >= 5);  // the goldens' margins: 5 to 8 of 10 cases per checkpoint
      e.child.Kill(SIGTERM);
      CHECK(e.child.Wait(30s) == 0);
    }
  }
}
