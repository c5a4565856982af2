// wsup-tokenize: a checkpoint's tokenizer on the command line, for checks
// and benchmarks. Reads one JSON object per line on stdin, {"text": "..."}
// or {"hex": "..."} (bytes that need not be UTF-8), and writes one per line:
//   {"ids": [...], "text": decode(ids), "streamed": the streamed decode}
// With --bench it writes nothing per line: it encodes every line --repeat
// times on one core and prints the throughput.
// With --chat-template FILE (a tokenizer_config.json, or a template's own
// text) it renders the chat template instead: each line is the template's
// variables ({"messages": [...], "add_generation_prompt": true, ...}) and
// each answer {"text": "..."} or {"error": "..."}.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/exit_codes.h"
#include "common/fs.h"
#include "text/jinja.h"
#include "text/tokenizer.h"

namespace {

using nlohmann::json;
using wsup::text::StreamDecoder;
using wsup::text::Tokenizer;

bool FromHex(const std::string& hex, std::string* out) {
  if (hex.size() % 2 != 0) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  out->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = nibble(hex[i]);
    const int lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

int RenderLines(const std::string& file) {
  auto src = wsup::ReadFile(file);
  if (!src.ok()) {
    std::cerr << "wsup-tokenize: " << src.error().message() << "\n";
    return wsup::kExitConfig;
  }
  std::string text = *src;
  json cfg = json::parse(text, nullptr, false);
  if (cfg.is_object()) {
    auto t = cfg.find("chat_template");
    if (t == cfg.end() || !t->is_string()) {
      std::cerr << "wsup-tokenize: " << file << " has no 'chat_template' string\n";
      return wsup::kExitConfig;
    }
    text = t->get<std::string>();
  }
  auto tmpl = wsup::text::jinja::Template::Parse(text, file);
  if (!tmpl.ok()) {
    std::cerr << "wsup-tokenize: " << tmpl.error().message() << "\n";
    return wsup::kExitConfig;
  }
  std::string line;
  size_t n = 0;
  while (std::getline(std::cin, line)) {
    ++n;
    if (line.empty()) continue;
    auto vars = nlohmann::ordered_json::parse(line, nullptr, false);
    if (!vars.is_object()) {
      std::cerr << "wsup-tokenize: stdin line " << n << ": expected a JSON object of the template's variables\n";
      return wsup::kExitUsage;
    }
    auto out = tmpl->Render(vars);
    std::cout << (out.ok() ? json{{"text", *out}} : json{{"error", out.error().message()}}).dump() << "\n";
  }
  return 0;
}

int Run(int argc, char** argv) {
  CLI::App app{"wsup-tokenize: encode and decode text with a checkpoint's tokenizer.json"};
  std::string path;
  bool no_special = false, skip_special = false, bench = false, both = false;
  int repeat = 1;
  std::string chat_template;
  app.add_option("--tokenizer", path, "the tokenizer.json to read");
  app.add_option("--chat-template", chat_template,
                 "render this chat template (a tokenizer_config.json, or the template's text) instead");
  app.add_flag("--no-special", no_special, "encode without the post-processor's tokens (a BOS, say)");
  app.add_flag("--skip-special", skip_special, "decode without the special tokens");
  app.add_flag("--bench", bench, "print the encode throughput instead of the ids");
  app.add_flag("--both", both, "answer with and without the special tokens on each line");
  app.add_option("--repeat", repeat, "with --bench: encode the input this many times")->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : wsup::kExitUsage;
  }
  if (!chat_template.empty()) return RenderLines(chat_template);
  if (path.empty()) {
    std::cerr << "wsup-tokenize: --tokenizer is required (or --chat-template)\n";
    return wsup::kExitUsage;
  }

  const auto t0 = std::chrono::steady_clock::now();
  auto tok = Tokenizer::Load(path);
  if (!tok.ok()) {
    std::cerr << "wsup-tokenize: " << tok.error().message() << "\n";
    return wsup::kExitConfig;
  }
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::string> inputs;
  std::string line;
  size_t n = 0;
  while (std::getline(std::cin, line)) {
    ++n;
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    std::string text;
    if (j.is_object() && j.contains("text") && j["text"].is_string()) {
      text = j["text"].get<std::string>();
    } else if (j.is_object() && j.contains("hex") && j["hex"].is_string() && FromHex(j["hex"].get<std::string>(), &text)) {
    } else {
      std::cerr << "wsup-tokenize: stdin line " << n << ": expected {\"text\": \"...\"} or {\"hex\": \"...\"}\n";
      return wsup::kExitUsage;
    }
    if (bench) {
      inputs.push_back(std::move(text));
      continue;
    }
    auto answer = [&](bool add_special, bool skip) {
      const std::vector<int32_t> ids = (*tok)->Encode(text, add_special);
      StreamDecoder stream(**tok, skip);
      std::string streamed;
      for (int32_t id : ids) streamed += stream.Add(id);
      streamed += stream.Finish();
      return json{{"ids", ids}, {"text", (*tok)->Decode(ids, skip)}, {"streamed", streamed}};
    };
    if (both) {
      std::cout << json{{"special", answer(true, false)}, {"plain", answer(false, true)}}.dump() << "\n";
    } else {
      std::cout << answer(!no_special, skip_special).dump() << "\n";
    }
  }
  if (bench) {
    size_t bytes = 0, tokens = 0;
    const auto b0 = std::chrono::steady_clock::now();
    for (int r = 0; r < repeat; ++r) {
      for (const std::string& s : inputs) {
        bytes += s.size();
        tokens += (*tok)->Encode(s, !no_special).size();
      }
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - b0).count();
    std::cout << json{{"load_ms", load_ms}, {"bytes", bytes}, {"tokens", tokens}, {"seconds", secs},
                      {"mb_per_s", secs > 0 ? static_cast<double>(bytes) / 1e6 / secs : 0.0}}
                     .dump()
              << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "wsup-tokenize: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "wsup-tokenize: an unknown error\n";
  }
  return 1;
}
