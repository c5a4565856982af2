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

// Each pair a merge, and its join a token of the vocabulary (ids from
// `next` on).
json Merges(const std::vector<std::pair<std::string, std::string>>& pairs, json* vocab, int next) {
  json merges = json::array();
  for (const auto& [l, r] : pairs) {
    merges.push_back(l + " " + r);
    (*vocab)[l + r] = next++;
  }
  return merges;
}

// A byte-level BPE: the 256 byte characters as ids 0..255, then merges.
json TinyByteLevel() {
  ByteAlphabet alphabet;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[alphabet.of_byte[b]] = b;
  json merges = Merges({{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}, {"\xC4\xA0", "w"}, {"o", "r"}}, &vocab, 256);
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

// SentencePiece's kind as Llama-2's file has it: no pre-tokenizer, "▁" for
// a space (Prepend and Replace), characters the vocabulary lacks as
// "<0xXX>" byte tokens, and a decoder that maps them back and strips the
// text's first space.
json TinySentencePiece() {
  const std::string sp = "\xE2\x96\x81";  // ▁
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  int next = 3;
  for (int b = 0; b < 256; ++b) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    vocab[std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">"] = next++;
  }
  for (const std::string& c : {sp, std::string("a"), std::string("b"), std::string("h"), std::string("i")}) {
    vocab[c] = next++;
  }
  json merges = Merges({{"a", "b"}, {"ab", "ab"}, {sp, "h"}, {sp + "h", "i"}}, &vocab, next);
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array({json{{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
                                    json{{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                                    json{{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}}})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers", json::array({json{{"type", "Prepend"}, {"prepend", sp}},
                                     json{{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({json{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({json{{"type", "Replace"}, {"pattern", {{"String", sp}}}, {"content", " "}},
                      json{{"type", "ByteFallback"}}, json{{"type", "Fuse"}},
                      json{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", true},
        {"vocab", vocab}, {"merges", merges}}}};
}

TEST_CASE("tokenizer: SentencePiece's kind - spaces as U+2581, byte fallback, one long piece merged by rank, and "
          "the text's first space stripped",
          "[text][tokenizer]") {
  auto t = Make(TinySentencePiece());
  const int32_t hi = *t->TokenToId("\xE2\x96\x81hi"), abab = *t->TokenToId("abab"), ab = *t->TokenToId("ab");
  const int32_t sp = *t->TokenToId("\xE2\x96\x81");
  CHECK(t->Encode("hi", true) == std::vector<int32_t>{1, hi});
  // "é" is not in the vocabulary: its two bytes.
  const int32_t c3 = *t->TokenToId("<0xC3>"), a9 = *t->TokenToId("<0xA9>");
  CHECK(t->Encode("hi\xC3\xA9", false) == std::vector<int32_t>{hi, c3, a9});
  // A whole prompt is one piece: 200 characters go through the heap's
  // merge, which must pick as the loop of short pieces does.
  std::string longer;
  for (int i = 0; i < 50; ++i) longer += "abab";
  std::vector<int32_t> want = {sp};
  for (int i = 0; i < 50; ++i) want.push_back(abab);
  CHECK(t->Encode(longer, false) == want);
  // "ab" first everywhere (rank 0), then "abab" (rank 1), leftmost first.
  want = {sp, abab, ab};
  want.insert(want.end(), 69, *t->TokenToId("b"));
  CHECK(t->Encode("ababa" + std::string(70, 'b'), false) == want);
  CHECK(t->Encode("ab", false) == std::vector<int32_t>{sp, ab});
  CHECK(t->Describe() == "BPE with byte fallback, " + std::to_string(t->vocab_size()) + " ids, 3 added (3 special)");

  // Decoding: the first space of the text goes, the others stay.
  CHECK(t->Decode({1, hi, hi}, true) == "hi hi");
  CHECK(t->Decode({1, hi, hi}, false) == "<s> hi hi");
  CHECK(t->Decode({hi, c3, a9, sp}, true) == "hi\xC3\xA9 ");
  // A run of byte tokens that is not UTF-8: U+FFFD for each of its bytes,
  // also the ones that would have made a character.
  const int32_t e4 = *t->TokenToId("<0xE4>"), ff = *t->TokenToId("<0xFF>");
  const std::string r(kReplacement);
  CHECK(t->Decode({hi, c3, a9, e4, hi}, true) == "hi" + r + r + r + " hi");
  CHECK(t->Decode({hi, c3, ff}, true) == "hi" + r + r);

  // Streamed: a run of byte tokens is held until it ends, and the pieces
  // add up to the decode.
  StreamDecoder stream(*t, true);
  CHECK(stream.Add(1).empty());
  CHECK(stream.Add(hi) == "hi");
  CHECK(stream.Add(c3).empty());
  CHECK(stream.Add(a9).empty());
  CHECK(stream.Add(hi) == "\xC3\xA9 hi");
  CHECK(stream.Add(e4).empty());
  CHECK(stream.Finish() == r);
  // A continuation after a prompt that had text keeps its first space; after
  // a prompt of special tokens only, the space is the text's first and goes.
  StreamDecoder after_text(*t, true);
  after_text.Prime({1, hi});
  CHECK(after_text.Add(hi) == " hi");
  StreamDecoder after_bos(*t, true);
  after_bos.Prime({1});
  CHECK(after_bos.Add(hi) == "hi");
  // Cut inside a run of byte tokens: the continuation gives the character.
  StreamDecoder cut(*t, true);
  cut.Prime({1, hi, c3});
  CHECK(cut.Add(a9).empty());
  CHECK(cut.Add(sp) == "\xC3\xA9 ");
}

TEST_CASE("tokenizer: a file it cannot reproduce exactly is refused, naming the JSON path and what is supported",
          "[text][tokenizer]") {
  json j = TinyByteLevel();
  SECTION("an unknown pre-tokenizer") {
    j["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Whitespace"}};
    CHECK(LoadError(j) ==
          "tokenizer.json: pre_tokenizer.pretokenizers[1].type: \"Whitespace\" is not supported (supported: Split, "
          "ByteLevel, Metaspace, Sequence); wsup-engine refuses a tokenizer it cannot reproduce exactly");
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
    CHECK(LoadError(j).find("decoder.type: \"WordPiece\" is not supported (supported: ByteLevel; Metaspace; or a "
                            "Sequence of Replace, ByteFallback, Fuse and Strip, in that order)") != std::string::npos);
  }
  SECTION("a SentencePiece decoder beside a ByteLevel pre-tokenizer") {
    j["decoder"] = TinySentencePiece()["decoder"];
    CHECK(LoadError(j).find("decoder: a ByteLevel decoder needs a ByteLevel pre-tokenizer") != std::string::npos);
  }
  SECTION("a SentencePiece decoder out of order, or stripping every token") {
    json sp = TinySentencePiece();
    std::swap(sp["decoder"]["decoders"][1], sp["decoder"]["decoders"][2]);
    CHECK(LoadError(sp).find("decoder.decoders[2]: ByteFallback out of order") != std::string::npos);
    sp = TinySentencePiece();
    sp["decoder"]["decoders"].erase(2);
    CHECK(LoadError(sp).find("decoder.decoders[2]: a Strip before Fuse (of every token) is not supported") !=
          std::string::npos);
    sp = TinySentencePiece();
    sp["decoder"]["decoders"][3]["stop"] = 1;
    CHECK(LoadError(sp).find("only a Strip of up to 8 spaces at the start") != std::string::npos);
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
