// The tokenizer (text/tokenizer.h) on small tokenizer.json files written
// here: the BPE merges, added tokens, the post-processor, decoding and
// streaming, and every file it must refuse, with the JSON path it names.
// The real files, against the reference library, are exactness_test.py's.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/pipeline.h"
#include "text/regex.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace wsup::text {
namespace {

using nlohmann::json;

// A byte-level BPE: the 256 byte characters as ids 0..255, then merges.
json TinyByteLevel() {
  ByteAlphabet alphabet;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[alphabet.of_byte[b]] = b;
  json merges = json::array();
  int next = 256;
  for (const auto& [l, r] : std::vector<std::pair<std::string, std::string>>{
           {"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}, {"\xC4\xA0", "w"}, {"o", "r"}}) {
    merges.push_back(l + " " + r);
    vocab[l + r] = next++;
  }
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       json::array({json{{"id", 300}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                    json{{"id", 301}, {"content", "<tool>"}, {"special", false}, {"normalized", false}},
                    json{{"id", 302}, {"content", "<tool_call>"}, {"special", false}, {"normalized", false}},
                    json{{"id", 303}, {"content", "[MASK]"}, {"special", true}, {"normalized", false},
                         {"lstrip", true}, {"rstrip", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({json{{"type", "Split"},
                           {"pattern", {{"Regex", R"( ?\p{L}+|\p{N}{1,3}|\s+(?!\S)|\s+| ?[^\s\p{L}\p{N}]+)"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                      json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({json{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {300}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"byte_fallback", false},
        {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges}}}};
}

std::unique_ptr<Tokenizer> Make(const json& j) {
  auto t = Tokenizer::FromJson(j.dump(), "tokenizer.json");
  if (!t.ok()) FAIL(t.error().message());
  return std::move(*t);
}

std::string LoadError(const json& j) {
  auto t = Tokenizer::FromJson(j.dump(), "tokenizer.json");
  REQUIRE_FALSE(t.ok());
  return t.error().message();
}

TEST_CASE("utf8: each maximal ill-formed subpart becomes one U+FFFD, and an incomplete tail is held",
          "[text][utf8]") {
  const std::string r(kReplacement);
  CHECK(ToValidUtf8("a\xF0\x9F\x98" "b") == "a" + r + "b");      // a truncated emoji: one
  CHECK(ToValidUtf8("\xC0\xAF") == r + r);                       // an overlong: two
  CHECK(ToValidUtf8("\xED\xA0\x80") == r + r + r);               // a surrogate: three
  CHECK(ToValidUtf8("\xF4\x90\x80\x80") == r + r + r + r);       // past U+10FFFF
  CHECK(ToValidUtf8("\xE2\x82\xAC") == "\xE2\x82\xAC");
  CHECK(IsValidUtf8("h\xC3\xA9"));
  CHECK_FALSE(IsValidUtf8("h\xC3"));
  CHECK(IncompleteTail("a\xF0\x9F") == 2);
  CHECK(IncompleteTail("a\xC3") == 1);
  CHECK(IncompleteTail("a\xFF") == 0);
  CHECK(IncompleteTail("a\xE0\x80") == 0);  // can never complete
  CHECK(IncompleteTail("\xC3\xA9") == 0);
}

TEST_CASE("regex: the whitespace class is Oniguruma's (no U+180E), and a category has the characters newer Unicode put in it",
          "[text][regex]") {
  auto space = Regex::Compile("\\s+", "test");
  REQUIRE(space.ok());
  std::vector<std::string> found;
  const std::string s = "a\xE1\xA0\x8E" "b\xC2\x85" "c d";  // U+180E, U+0085, a space
  space->FindAll(s, [&](size_t b, size_t e) { found.push_back(s.substr(b, e - b)); });
  CHECK(found == std::vector<std::string>{"\xC2\x85", " "});
  auto symbol = Regex::Compile("\\p{S}", "test");
  REQUIRE(symbol.ok());
  int n = 0;
  symbol->FindAll("\xF0\x9F\x9B\x9C", [&](size_t, size_t) { ++n; });  // U+1F6DC, a symbol of Unicode 15
  CHECK(n == 1);
  CHECK_FALSE(TranslateOnigPattern("[^\\S]").ok());
  auto bad = Regex::Compile("(unclosed", "pre_tokenizer.pattern");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message().find("pre_tokenizer.pattern: the pattern does not compile at byte") == 0);
}

TEST_CASE("tokenizer: merges by rank, the post-processor's BOS only when asked, and decode back",
          "[text][tokenizer]") {
  auto t = Make(TinyByteLevel());
  const auto hello = t->Encode("hello world", false);
  // "hello" merges to one token; " world" is "Ġw" + o r l d, "or" merged.
  REQUIRE(hello.size() == 5);
  CHECK(hello[0] == *t->TokenToId("hello"));
  CHECK(hello[1] == *t->TokenToId("\xC4\xA0w"));
  CHECK(hello[2] == *t->TokenToId("or"));
  CHECK(t->Encode("hello world", true).front() == 300);
  CHECK(t->Decode(hello, true) == "hello world");
  CHECK(t->vocab_size() == 304);
  CHECK(t->Describe() == "BPE byte-level, 304 ids, 4 added (2 special)");
}

TEST_CASE("tokenizer: added tokens match leftmost-longest in the raw text, strip what they say, and special ones "
          "are skipped on request",
          "[text][tokenizer]") {
  auto t = Make(TinyByteLevel());
  const auto ids = t->Encode("a<tool_call>b<tool><s>", false);
  CHECK(ids == std::vector<int32_t>{'a', 302, 'b', 301, 300});
  // [MASK] takes the spaces on both sides.
  const auto masked = t->Encode("a  [MASK]  b", false);
  CHECK(masked == std::vector<int32_t>{'a', 303, 'b'});
  CHECK(t->Decode(ids, false) == "a<tool_call>b<tool><s>");
  CHECK(t->Decode(ids, true) == "a<tool_call>b<tool>");
  // A cut-short token is text.
  CHECK(t->Encode("<too", false).size() == 4);
}

TEST_CASE("tokenizer: text that is not UTF-8 is encoded as its replacement, and a stream never splits a character",
          "[text][tokenizer]") {
  auto t = Make(TinyByteLevel());
  CHECK(t->Encode("x\xFFy", false) == t->Encode("x\xEF\xBF\xBDy", false));
  // "é" is two byte tokens: the first completes nothing.
  StreamDecoder stream(*t, true);
  CHECK(stream.Add(0xC3).empty());
  CHECK(stream.Add(0xA9) == "\xC3\xA9");
  CHECK(stream.Add(0xE2).empty());
  CHECK(stream.Finish() == std::string(kReplacement));
  CHECK(t->Decode({0xC3, 0xA9, 0xE2}, true) == "\xC3\xA9" + std::string(kReplacement));

  // Continued after a context that stops inside a character (a stream cut
  // after a token whose character was not complete): the first stream said
  // nothing of it, and the continuation gives what one stream would.
  StreamDecoder first(*t, true);
  CHECK(first.Add('h') == "h");
  CHECK(first.Add(0xC3).empty());
  StreamDecoder rest(*t, true);
  rest.Prime({'h', 0xC3});
  CHECK(rest.Add(0xA9) == "\xC3\xA9");
  StreamDecoder broken(*t, true);
  broken.Prime({0x61, 0xE2, 0x82});
  CHECK(broken.Add('x') == std::string(kReplacement) + "x");
  CHECK(t->Decode({0x61, 0xE2, 0x82, 'x'}, true) == "a" + std::string(kReplacement) + "x");
  StreamDecoder whole(*t, true);
  whole.Prime({'a', 0xC3, 0xA9});  // a context that ends a character holds nothing
  CHECK(whole.Add('b') == "b");
}

TEST_CASE("tokenizer: a file it cannot reproduce exactly is refused, naming the JSON path and what is supported",
          "[text][tokenizer]") {
  json j = TinyByteLevel();
  SECTION("an unknown pre-tokenizer") {
    j["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Whitespace"}};
    CHECK(LoadError(j) ==
          "tokenizer.json: pre_tokenizer.pretokenizers[1].type: \"Whitespace\" is not supported (supported: Split, "
          "ByteLevel, Sequence); wsup-engine refuses a tokenizer it cannot reproduce exactly");
  }
  SECTION("another model") {
    j["model"]["type"] = "WordPiece";
    CHECK(LoadError(j).find("model.type: \"WordPiece\" is not supported (supported: BPE)") != std::string::npos);
  }
  SECTION("an unknown normalizer") {
    j["normalizer"] = {{"type", "BertNormalizer"}};
    CHECK(LoadError(j).find("normalizer.type: \"BertNormalizer\" is not supported") != std::string::npos);
  }
  SECTION("a merge of tokens the vocabulary lacks") {
    j["model"]["merges"].push_back("zz qq");
    CHECK(LoadError(j).find("model.merges[6]: names a token the vocabulary does not have") != std::string::npos);
  }
  SECTION("a vocabulary entry that is not an id") {
    j["model"]["vocab"]["zz"] = "7";
    CHECK(LoadError(j).find("model.vocab[\"zz\"]: a string, not an id") != std::string::npos);
  }
  SECTION("a merge that is not a pair") {
    j["model"]["merges"].push_back(json::array({"h"}));
    CHECK(LoadError(j).find("model.merges[6]: not a pair of tokens") != std::string::npos);
  }
  SECTION("no vocabulary") {
    j["model"].erase("vocab");
    CHECK(LoadError(j).find("model.vocab: missing, or not an object") != std::string::npos);
  }
  SECTION("an inverted split") {
    j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true;
    CHECK(LoadError(j).find("pre_tokenizer.pretokenizers[0].invert: true is not supported") != std::string::npos);
  }
  SECTION("a pattern PCRE2 cannot compile") {
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a";
    CHECK(LoadError(j).find("pre_tokenizer.pretokenizers[0].pattern: the pattern does not compile") !=
          std::string::npos);
  }
  SECTION("padding set") {
    j["padding"] = {{"strategy", "BatchLongest"}};
    CHECK(LoadError(j).find("padding: must be null") != std::string::npos);
  }
  SECTION("another decoder") {
    j["decoder"] = {{"type", "WordPiece"}};
    CHECK(LoadError(j).find("decoder.type: \"WordPiece\" is not supported (supported: ByteLevel)") !=
          std::string::npos);
  }
  SECTION("not JSON") {
    auto t = Tokenizer::FromJson("{\"model\": ", "tok.json");
    REQUIRE_FALSE(t.ok());
    CHECK(t.error().message() == "tok.json: not valid JSON at byte 11; it should be a Hugging Face tokenizer.json");
    const std::string deep(100, '[');
    auto nested = Tokenizer::FromJson(deep, "deep.json");
    REQUIRE_FALSE(nested.ok());
    CHECK(nested.error().message().find("deep.json") == 0);
  }
  SECTION("a file that is not there") {
    auto t = Tokenizer::Load("/nonexistent/tokenizer.json");
    REQUIRE_FALSE(t.ok());
    CHECK(t.error().message().find("/nonexistent/tokenizer.json") != std::string::npos);
  }
}

}  // namespace
}  // namespace wsup::text
