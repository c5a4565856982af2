// Reading tokenizer.json into a Tokenizer's parts (pipeline.h). Every part
// the file names is either read exactly or refused with its JSON path and
// what is supported: a tokenizer that encodes differently from the one the
// model was trained with answers wrongly, and nothing would say so.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <system_error>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/json_limits.h"
#include "text/pipeline.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace wsup::text {

namespace {

using nlohmann::json;
using Pipeline = Tokenizer::Pipeline;

constexpr size_t kMaxTokenizerBytes = size_t{256} << 20;

// GPT-2's split, which a ByteLevel pre-tokenizer with use_regex applies.
constexpr const char* kGpt2Split = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The file read in one pass (nlohmann's SAX interface): everything as a
// DOM but model.vocab and model.merges, which are 95% of a real file and
// are collected as they are read. A DOM of them would cost most of the
// load (Qwen3's 11 MB: about 0.5 s against 0.07 s for the pass itself).
// Its implicit members only make empty values: a null json allocates
// nothing and throws nothing.
struct Collected {  // NOLINT(bugprone-exception-escape): see above
  json rest;
  bool has_vocab = false, has_merges = false;
  std::vector<std::pair<std::string, int32_t>> vocab;  // in the file's order
  // Each merge as its two tokens written together, and where the first ends.
  std::vector<std::pair<std::string, size_t>> merges;
  std::string error;  // the first entry that is not one, with its path; or a syntax error
  // Called once model.vocab is read (the merges follow it in the files):
  // the vocabulary's map is built beside the rest of the pass.
  std::function<void()> vocab_done;
};

class Collector final : public nlohmann::json_sax<json> {
 public:
  explicit Collector(Collected* out) : out_(out) {}

  bool null() override { return Value(json(nullptr), "null"); }
  bool boolean(bool v) override { return Value(json(v), "a boolean"); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::kVocab) return VocabId(v);
    return Value(json(v), "a number");
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab) return VocabId(v > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v));
    return Value(json(v), "a number");
  }
  bool number_float(number_float_t v, const string_t&) override { return Value(json(v), "a number"); }
  bool binary(binary_t&) override { return Fail("binary values are not JSON"); }
  bool string(string_t& v) override {
    if (mode_ == Mode::kMerges) {
      // "a b": the first space separates the pair.
      const size_t sp = v.find(' ');
      if (sp == std::string::npos) return Fail(MergePath() + ": not \"left right\"");
      v.erase(sp, 1);
      out_->merges.emplace_back(std::move(v), sp);
      return true;
    }
    if (mode_ == Mode::kPair) {
      pair_.push_back(std::move(v));
      return true;
    }
    return Value(json(std::move(v)), "a string");
  }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool start_object(std::size_t) override {
    if (++depth_ > kMaxJsonDepth) return Fail("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    if (mode_ == Mode::kDom && !stack_.empty() && stack_.back() == model_ && key_ == "vocab") {
      mode_ = Mode::kVocab;
      out_->has_vocab = true;
      return true;
    }
    if (mode_ != Mode::kDom) return Value(json(), "an object");
    stack_.push_back(Put(json::object()));
    if (stack_.size() == 2 && key_ == "model") model_ = stack_.back();
    return true;
  }
  bool end_object() override {
    --depth_;
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      if (out_->vocab_done) out_->vocab_done();
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (++depth_ > kMaxJsonDepth) return Fail("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    if (mode_ == Mode::kDom && !stack_.empty() && stack_.back() == model_ && key_ == "merges") {
      mode_ = Mode::kMerges;
      out_->has_merges = true;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kPair;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::kDom) return Value(json(), "an array");
    stack_.push_back(Put(json::array()));
    return true;
  }
  bool end_array() override {
    --depth_;
    if (mode_ == Mode::kPair) {
      if (pair_.size() != 2) return Fail(MergePath() + ": not a pair of tokens");
      const size_t split = pair_[0].size();
      out_->merges.emplace_back(pair_[0] + pair_[1], split);
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) override {
    if (out_->error.empty()) out_->error = "not valid JSON at byte " + std::to_string(position);
    return false;
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kPair };

  bool Fail(std::string why) {
    if (out_->error.empty()) out_->error = std::move(why);
    return false;
  }
  std::string MergePath() const { return "model.merges[" + std::to_string(out_->merges.size()) + "]"; }
  bool VocabId(int64_t v) {
    if (v < 0 || v > INT32_MAX - 1) return Fail("model.vocab[\"" + key_ + "\"]: not an id (a non-negative integer)");
    out_->vocab.emplace_back(std::move(key_), static_cast<int32_t>(v));
    return true;
  }
  // A scalar (or, in the collected parts, anything that is not one of their entries).
  bool Value(json v, const char* what) {
    if (mode_ == Mode::kVocab) return Fail("model.vocab[\"" + key_ + "\"]: " + what + ", not an id");
    if (mode_ == Mode::kMerges) return Fail(MergePath() + ": " + what + ", not a pair of tokens");
    if (mode_ == Mode::kPair) return Fail(MergePath() + ": " + what + " in a pair of tokens");
    Put(std::move(v));
    return true;
  }
  json* Put(json v) {
    if (stack_.empty()) {
      out_->rest = std::move(v);
      return &out_->rest;
    }
    json& top = *stack_.back();
    if (top.is_object()) return &(top[key_] = std::move(v));
    top.push_back(std::move(v));
    return &top.back();
  }

  Collected* out_;
  std::vector<json*> stack_;  // the containers being filled, outermost first
  json* model_ = nullptr;     // the top-level "model" object
  std::string key_;
  Mode mode_ = Mode::kDom;
  int depth_ = 0;
  std::vector<std::string> pair_;
};

class Reader {
 public:
  explicit Reader(std::string name) : name_(std::move(name)) {}

  Error Bad(const std::string& path, const std::string& what) const {
    return InvalidArgument(name_ + ": " + path + ": " + what);
  }
  Error Unsupported(const std::string& path, const std::string& got, const std::string& supported) const {
    return Bad(path, "\"" + got + "\" is not supported (supported: " + supported +
                         "); wsup-engine refuses a tokenizer it cannot reproduce exactly");
  }

  Result<std::string> Str(const json& j, const char* key, const std::string& path) const {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) return Bad(path + "." + key, "missing, or not a string");
    return it->get<std::string>();
  }
  // Each item of the array n[key] read by `each` (a Sequence's parts).
  template <typename Fn>
  Status Each(const json& n, const char* key, const std::string& path, Fn each) const {
    auto it = n.find(key);
    if (it == n.end() || !it->is_array()) return Bad(path + "." + key, "missing, or not an array");
    for (size_t i = 0; i < it->size(); ++i) {
      WSUP_RETURN_IF_ERROR(each((*it)[i], path + "." + key + "[" + std::to_string(i) + "]"));
    }
    return Status::Ok();
  }
  // A part that may be null (absent), a Sequence of parts under seq_key, or
  // one part: each leaf goes to leaf(part, its type, its path).
  template <typename Fn>
  Status Part(const json& n, const std::string& path, const char* seq_key, const Fn& leaf) const {
    if (n.is_null()) return Status::Ok();
    if (!n.is_object()) return Bad(path, "not an object");
    WSUP_ASSIGN_OR_RETURN(std::string type, Str(n, "type", path));
    if (type == "Sequence") {
      return Each(n, seq_key, path, [&](const json& e, const std::string& at) { return Part(e, at, seq_key, leaf); });
    }
    return leaf(n, type, path);
  }
  bool Flag(const json& j, const char* key, bool fallback) const {
    auto it = j.find(key);
    return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
  }

  Status NormalizerPart(const json& n, const std::string& type, const std::string& path, Pipeline* p) const {
    Normalizer out;
    if (type == "NFC") {
      out.kind = Normalizer::Kind::kNfc;
    } else if (type == "NFD") {
      out.kind = Normalizer::Kind::kNfd;
    } else if (type == "NFKC") {
      out.kind = Normalizer::Kind::kNfkc;
    } else if (type == "NFKD") {
      out.kind = Normalizer::Kind::kNfkd;
    } else if (type == "Prepend") {
      out.kind = Normalizer::Kind::kPrepend;
      WSUP_ASSIGN_OR_RETURN(out.content, Str(n, "prepend", path));
    } else if (type == "Replace") {
      out.kind = Normalizer::Kind::kReplace;
      auto pat = n.find("pattern");
      if (pat == n.end() || !pat->is_object() || !pat->contains("String") || !(*pat)["String"].is_string()) {
        return Bad(path + ".pattern", "only a {\"String\": ...} pattern is supported for Replace");
      }
      out.pattern = (*pat)["String"].get<std::string>();
      WSUP_ASSIGN_OR_RETURN(out.content, Str(n, "content", path));
    } else {
      return Unsupported(path + ".type", type, "NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence");
    }
    p->normalizers.push_back(std::move(out));
    return Status::Ok();
  }

  // prepend_scheme, or (older files) add_prefix_space.
  Result<PreTokenizer::Prepend> MetaspacePrepend(const json& n, const std::string& path) const {
    auto scheme = n.find("prepend_scheme");
    if (scheme == n.end()) return Flag(n, "add_prefix_space", true) ? PreTokenizer::Prepend::kAlways
                                                                     : PreTokenizer::Prepend::kNever;
    const std::string s = scheme->is_string() ? scheme->get<std::string>() : "";
    if (s == "always") return PreTokenizer::Prepend::kAlways;
    if (s == "first") return PreTokenizer::Prepend::kFirst;
    if (s == "never") return PreTokenizer::Prepend::kNever;
    return Unsupported(path + ".prepend_scheme", scheme->dump(), "always, first, never");
  }

  Status PreTokenizerPart(const json& n, const std::string& type, const std::string& path, Pipeline* p) const {
    PreTokenizer out;
    if (type == "Split") {
      out.kind = PreTokenizer::Kind::kSplit;
      if (Flag(n, "invert", false)) return Bad(path + ".invert", "true is not supported");
      WSUP_ASSIGN_OR_RETURN(std::string behavior, Str(n, "behavior", path));
      if (behavior == "Isolated") {
        out.behavior = PreTokenizer::Behavior::kIsolated;
      } else if (behavior == "Removed") {
        out.behavior = PreTokenizer::Behavior::kRemoved;
      } else {
        return Unsupported(path + ".behavior", behavior, "Isolated, Removed");
      }
      auto pat = n.find("pattern");
      if (pat == n.end() || !pat->is_object()) return Bad(path + ".pattern", "missing, or not an object");
      std::string regex;
      if (pat->contains("Regex") && (*pat)["Regex"].is_string()) {
        regex = (*pat)["Regex"].get<std::string>();
      } else if (pat->contains("String") && (*pat)["String"].is_string()) {
        // A literal: every character that means something to a regex escaped.
        for (char c : (*pat)["String"].get<std::string>()) {
          if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) regex += '\\';
          regex += c;
        }
      } else {
        return Bad(path + ".pattern", "needs a \"Regex\" or a \"String\"");
      }
      auto re = Regex::Compile(regex, name_ + ": " + path + ".pattern");
      if (!re.ok()) return re.error();
      out.regex.push_back(std::move(*re));
    } else if (type == "ByteLevel") {
      out.kind = PreTokenizer::Kind::kByteLevel;
      out.add_prefix_space = Flag(n, "add_prefix_space", false);
      out.use_regex = Flag(n, "use_regex", true);
      p->byte_level = true;
      if (out.use_regex && p->gpt2.empty()) {
        auto re = Regex::Compile(kGpt2Split, name_ + ": " + path + " (GPT-2's split)");
        if (!re.ok()) return re.error();
        p->gpt2.push_back(std::move(*re));
      }
    } else if (type == "Metaspace") {
      out.kind = PreTokenizer::Kind::kMetaspace;
      WSUP_ASSIGN_OR_RETURN(out.prepend, MetaspacePrepend(n, path));
      WSUP_ASSIGN_OR_RETURN(out.replacement, Str(n, "replacement", path));
      if (out.replacement.empty()) return Bad(path + ".replacement", "empty");
      out.split = Flag(n, "split", true);
    } else {
      return Unsupported(path + ".type", type, "Split, ByteLevel, Metaspace, Sequence");
    }
    p->pre_tokenizers.push_back(std::move(out));
    return Status::Ok();
  }

  Status PostProcessorPart(const json& n, const std::string& type, const std::string& path, Pipeline* p) const {
    if (type == "ByteLevel") return Status::Ok();  // offsets only: the ids are the same
    if (type != "TemplateProcessing") {
      return Unsupported(path + ".type", type, "ByteLevel, TemplateProcessing, Sequence");
    }
    auto single = n.find("single");
    if (single == n.end() || !single->is_array()) return Bad(path + ".single", "missing, or not an array");
    auto specials = n.find("special_tokens");
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const json& piece = (*single)[i];
      const std::string where = path + ".single[" + std::to_string(i) + "]";
      if (piece.contains("Sequence")) {
        if (seen_sequence) return Bad(where, "a second sequence in `single` is not supported");
        seen_sequence = true;
        continue;
      }
      if (!piece.contains("SpecialToken") || !piece["SpecialToken"].contains("id") ||
          !piece["SpecialToken"]["id"].is_string()) {
        return Bad(where, "needs a \"Sequence\" or a \"SpecialToken\" with an id");
      }
      const std::string name = piece["SpecialToken"]["id"].get<std::string>();
      if (specials == n.end() || !specials->contains(name) || !(*specials)[name].contains("ids") ||
          !(*specials)[name]["ids"].is_array()) {
        return Bad(path + ".special_tokens", "names no ids for \"" + name + "\"");
      }
      for (const json& id : (*specials)[name]["ids"]) {
        if (!id.is_number_integer()) return Bad(path + ".special_tokens." + name + ".ids", "not integers");
        (seen_sequence ? p->suffix_ids : p->prefix_ids).push_back(id.get<int32_t>());
      }
    }
    if (!seen_sequence) return Bad(path + ".single", "has no {\"Sequence\": ...} for the text");
    return Status::Ok();
  }

  // ByteLevel alone, or SentencePiece's chain: Replace..., ByteFallback,
  // Fuse, Strip, in that order (each but Fuse optional; Strip of spaces at
  // the start of the joined text only).
  Status Decoder(const json& n, const std::string& path, Pipeline* p, bool* byte_level) const {
    if (!n.is_object()) return Bad(path, "missing: a ByteLevel decoder or a SentencePiece one is needed");
    WSUP_ASSIGN_OR_RETURN(std::string type, Str(n, "type", path));
    if (type == "ByteLevel") {
      *byte_level = true;
      return Status::Ok();
    }
    *byte_level = false;
    if (type == "Metaspace") {
      // The replacement back to a space, and the first token's leading
      // space removed unless nothing was prepended: the same as Replace,
      // Fuse and Strip of one space (tokens are never empty).
      WSUP_ASSIGN_OR_RETURN(std::string replacement, Str(n, "replacement", path));
      if (replacement.empty()) return Bad(path + ".replacement", "empty");
      WSUP_ASSIGN_OR_RETURN(PreTokenizer::Prepend prepend, MetaspacePrepend(n, path));
      p->decode_replace.emplace_back(std::move(replacement), " ");
      p->strip_start = prepend == PreTokenizer::Prepend::kNever ? 0 : 1;
      return Status::Ok();
    }
    const char* kChain =
        "ByteLevel; Metaspace; or a Sequence of Replace, ByteFallback, Fuse and Strip, in that order";
    if (type != "Sequence") return Unsupported(path + ".type", type, kChain);
    // Where each step may come: 0 Replace, 1 ByteFallback, 2 Fuse, 3 Strip.
    int stage = 0;
    bool fused = false;
    return Each(n, "decoders", path, [&](const json& d, const std::string& at) -> Status {
      if (!d.is_object()) return Bad(at, "not an object");
      WSUP_ASSIGN_OR_RETURN(std::string t, Str(d, "type", at));
      const int want = t == "Replace" ? 0 : t == "ByteFallback" ? 1 : t == "Fuse" ? 2 : t == "Strip" ? 3 : -1;
      if (want < 0) return Unsupported(at + ".type", t, kChain);
      if (want < stage || (want == stage && want != 0)) return Bad(at, t + " out of order (supported: " + kChain + ")");
      stage = want;
      if (t == "Replace") {
        auto pat = d.find("pattern");
        if (pat == d.end() || !pat->is_object() || !pat->contains("String") || !(*pat)["String"].is_string() ||
            (*pat)["String"].get_ref<const std::string&>().empty()) {
          return Bad(at + ".pattern", "only a non-empty {\"String\": ...} pattern is supported for Replace");
        }
        WSUP_ASSIGN_OR_RETURN(std::string content, Str(d, "content", at));
        p->decode_replace.emplace_back((*pat)["String"].get<std::string>(), std::move(content));
      } else if (t == "ByteFallback") {
        p->decode_byte_fallback = true;
      } else if (t == "Fuse") {
        fused = true;
      } else {
        auto start = d.find("start");
        auto stop = d.find("stop");
        auto content = d.find("content");
        if (content == d.end() || *content != " " || start == d.end() || !start->is_number_unsigned() ||
            start->get<uint64_t>() > 8 || stop == d.end() || !stop->is_number_unsigned() || stop->get<uint64_t>() != 0) {
          return Bad(at, "only a Strip of up to 8 spaces at the start (content \" \", stop 0) is supported");
        }
        if (!fused) return Bad(at, "a Strip before Fuse (of every token) is not supported");
        p->strip_start = static_cast<int>(start->get<uint64_t>());
      }
      return Status::Ok();
    });
  }

  Status Model(const json& m, Collected& c, const std::string& path, Pipeline* p) const {
    if (!m.is_object()) return Bad(path, "missing, or not an object");
    auto type = m.find("type");
    // Older files leave the type out of a BPE model.
    const std::string t = type != m.end() && type->is_string() ? type->get<std::string>() : "BPE";
    if (t != "BPE") return Unsupported(path + ".type", t, "BPE");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      auto it = m.find(key);
      if (it != m.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
        return Bad(path + "." + key, "a non-empty value is not supported");
      }
    }
    if (m.contains("dropout") && !m["dropout"].is_null()) return Bad(path + ".dropout", "dropout is not supported");
    p->ignore_merges = Flag(m, "ignore_merges", false);
    p->byte_fallback = Flag(m, "byte_fallback", false);
    p->fuse_unk = Flag(m, "fuse_unk", false);
    if (!c.has_vocab) return Bad(path + ".vocab", "missing, or not an object");
    if (!c.has_merges) return Bad(path + ".merges", "missing, or not an array");
    p->merges.reserve(c.merges.size());
    for (size_t r = 0; r < c.merges.size(); ++r) {
      const absl::string_view joined(c.merges[r].first);
      const size_t split = c.merges[r].second;
      auto l = p->vocab.find(joined.substr(0, split));
      auto rt = p->vocab.find(joined.substr(split));
      auto merged = p->vocab.find(joined);
      if (l == p->vocab.end() || rt == p->vocab.end() || merged == p->vocab.end()) {
        return Bad(path + ".merges[" + std::to_string(r) + "]", "names a token the vocabulary does not have");
      }
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(l->second)) << 32) |
                           static_cast<uint32_t>(rt->second);
      // The first (lowest) rank of a pair listed twice wins, as in the reference.
      p->merges.emplace(key, (static_cast<uint64_t>(r) << 32) | static_cast<uint32_t>(merged->second));
    }
    auto unk = m.find("unk_token");
    if (unk != m.end() && unk->is_string()) {
      auto it = p->vocab.find(absl::string_view(unk->get_ref<const std::string&>()));
      if (it == p->vocab.end()) return Bad(path + ".unk_token", "not in the vocabulary");
      p->unk_id = it->second;
    }
    return Status::Ok();
  }

  Status Added(const json& a, Pipeline* p) const {
    if (a.is_null()) return Status::Ok();
    if (!a.is_array()) return Bad("added_tokens", "not an array");
    for (size_t i = 0; i < a.size(); ++i) {
      const json& t = a[i];
      const std::string path = "added_tokens[" + std::to_string(i) + "]";
      AddedToken out;
      if (!t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0) {
        return Bad(path + ".id", "missing, or not an id");
      }
      out.id = t["id"].get<int32_t>();
      WSUP_ASSIGN_OR_RETURN(out.content, Str(t, "content", path));
      if (out.content.empty()) return Bad(path + ".content", "empty");
      if (Flag(t, "single_word", false)) return Bad(path + ".single_word", "true is not supported");
      out.lstrip = Flag(t, "lstrip", false);
      out.rstrip = Flag(t, "rstrip", false);
      out.normalized = Flag(t, "normalized", !Flag(t, "special", false));
      out.special = Flag(t, "special", false);
      p->added_by_id[out.id] = p->added.size();
      p->added.push_back(std::move(out));
    }
    std::vector<size_t> order(p->added.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(),
                     [p](size_t x, size_t y) { return p->added[x].content.size() > p->added[y].content.size(); });
    for (size_t k : order) {
      Pipeline::AddedIndex& index = p->added[k].normalized ? p->norm_added : p->raw_added;
      index.by_first[static_cast<unsigned char>(p->added[k].content[0])].push_back(k);
      index.empty = false;
    }
    return Status::Ok();
  }

 private:
  std::string name_;
};

}  // namespace

ByteAlphabet::ByteAlphabet() {
  byte_of.fill(-1);
  // GPT-2's bytes_to_unicode: the printable bytes stand for themselves, the
  // rest for the code points from U+0100 on, in byte order.
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
    AppendUtf8(cp, &of_byte[b]);
    byte_of[cp] = static_cast<int16_t>(b);
  }
}

namespace {

// The vocabulary's map and the id-to-token table, from p->tokens.
void BuildVocab(Pipeline* p) {
  p->vocab.reserve(p->tokens.size());
  int32_t top = -1;
  for (const auto& [token, id] : p->tokens) {
    p->vocab.emplace(absl::string_view(token), id);
    top = std::max(top, id);
  }
  p->id_to_token.assign(static_cast<size_t>(top) + 1, absl::string_view());
  for (const auto& [token, id] : p->vocab) p->id_to_token[id] = token;
}

// The file mapped, not copied: an 11 MB read costs a copy and the faults
// of a fresh buffer, a third of a load.
class MappedFile {
 public:
  ~MappedFile() {
    if (data_) ::munmap(data_, size_);
  }
  Status Open(const std::string& path, size_t max_bytes) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return Error(errno == ENOENT ? Code::kNotFound : Code::kIo, path + ": " + std::strerror(errno));
    }
    struct stat st {};
    Status s = Status::Ok();
    if (::fstat(fd, &st) != 0) {
      s = Error(Code::kIo, path + ": " + std::strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
      s = InvalidArgument(path + ": not a regular file; it should be a Hugging Face tokenizer.json");
    } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
      s = InvalidArgument(path + ": larger than " + std::to_string(max_bytes >> 20) +
                          " MiB; it should be a Hugging Face tokenizer.json");
    } else if (st.st_size > 0) {
      size_ = static_cast<size_t>(st.st_size);
      void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
      if (m == MAP_FAILED) {
        s = Error(Code::kIo, path + ": mmap: " + std::strerror(errno));
      } else {
        data_ = m;
      }
    }
    ::close(fd);
    return s;
  }
  std::string_view text() const { return data_ ? std::string_view(static_cast<const char*>(data_), size_) : ""; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json_text, const std::string& name) {
  // A real tokenizer.json is up to tens of MB (Qwen3's is 11 MB) and nests
  // a few levels (the pass refuses more than kMaxJsonDepth).
  if (json_text.size() > kMaxTokenizerBytes) {
    return InvalidArgument(name + ": larger than " + std::to_string(kMaxTokenizerBytes >> 20) +
                           " MiB; it should be a Hugging Face tokenizer.json");
  }
  Collected c;
  // Room for the entries the file's size suggests (a vocabulary entry and
  // a merge take 30 to 60 bytes of text), so the lists are not regrown and
  // copied a dozen times.
  c.vocab.reserve(json_text.size() / 80);
  c.merges.reserve(json_text.size() / 80);
  auto p = std::make_unique<Pipeline>();
  Pipeline* pp = p.get();
  // The vocabulary's map is built on a thread of its own while the pass
  // reads the merges; joined before anything reads it (and on every
  // return).
  std::thread vocab_thread;
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{vocab_thread};
  bool vocab_built = false;
  c.vocab_done = [&] {
    if (vocab_built) return;
    vocab_built = true;
    pp->tokens = std::move(c.vocab);
    try {
      vocab_thread = std::thread([pp] { BuildVocab(pp); });
    } catch (const std::system_error&) {
      BuildVocab(pp);  // no thread to be had: on this one
    }
  };
  Collector collector(&c);
  const bool parsed = json::sax_parse(json_text.begin(), json_text.end(), &collector, json::input_format_t::json,
                                      /*strict=*/true);
  if (vocab_thread.joinable()) vocab_thread.join();
  if (!parsed || !c.error.empty()) {
    return InvalidArgument(name + ": " + (c.error.empty() ? std::string("not valid JSON") : c.error) +
                           "; it should be a Hugging Face tokenizer.json");
  }
  const json& j = c.rest;
  if (!j.is_object()) return InvalidArgument(name + ": not a JSON object; it should be a Hugging Face tokenizer.json");
  Reader r(name);
  for (const char* key : {"truncation", "padding"}) {
    if (j.contains(key) && !j[key].is_null()) {
      return r.Bad(key, "must be null: the engine decides lengths itself; remove it from the file");
    }
  }
  WSUP_RETURN_IF_ERROR(r.Model(j.contains("model") ? j["model"] : json(), c, "model", p.get()));
  WSUP_RETURN_IF_ERROR(r.Part(j.value("normalizer", json()), "normalizer", "normalizers",
                              [&](const json& n, const std::string& type, const std::string& at) {
                                return r.NormalizerPart(n, type, at, pp);
                              }));
  WSUP_RETURN_IF_ERROR(r.Part(j.value("pre_tokenizer", json()), "pre_tokenizer", "pretokenizers",
                              [&](const json& n, const std::string& type, const std::string& at) {
                                return r.PreTokenizerPart(n, type, at, pp);
                              }));
  WSUP_RETURN_IF_ERROR(r.Part(j.value("post_processor", json()), "post_processor", "processors",
                              [&](const json& n, const std::string& type, const std::string& at) {
                                return r.PostProcessorPart(n, type, at, pp);
                              }));
  bool byte_level_decoder = false;
  WSUP_RETURN_IF_ERROR(r.Decoder(j.value("decoder", json()), "decoder", p.get(), &byte_level_decoder));
  WSUP_RETURN_IF_ERROR(r.Added(j.value("added_tokens", json()), p.get()));
  if (byte_level_decoder != p->byte_level) {
    return r.Bad("decoder", "a ByteLevel decoder needs a ByteLevel pre-tokenizer, and the other way round");
  }
  p->size = static_cast<int32_t>(p->id_to_token.size());
  for (const AddedToken& t : p->added) p->size = std::max(p->size, t.id + 1);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(p)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  MappedFile file;
  WSUP_RETURN_IF_ERROR(file.Open(path, kMaxTokenizerBytes));
  return FromJson(file.text(), path);
}

}  // namespace wsup::text
