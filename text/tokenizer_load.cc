// Reading tokenizer.json into a Tokenizer's parts (pipeline.h). Every part
// the file names is either read exactly or refused with its JSON path and
// what is supported: a tokenizer that encodes differently from the one the
// model was trained with answers wrongly, and nothing would say so.
#include <algorithm>
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
  bool Flag(const json& j, const char* key, bool fallback) const {
    auto it = j.find(key);
    return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
  }

  Status Normalizers(const json& n, const std::string& path, Pipeline* p) const {
    if (n.is_null()) return Status::Ok();
    if (!n.is_object()) return Bad(path, "not an object");
    WSUP_ASSIGN_OR_RETURN(std::string type, Str(n, "type", path));
    if (type == "Sequence") {
      return Each(n, "normalizers", path, [&](const json& e, const std::string& at) { return Normalizers(e, at, p); });
    }
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

  Status PreTokenizers(const json& n, const std::string& path, Pipeline* p) const {
    if (n.is_null()) return Status::Ok();
    if (!n.is_object()) return Bad(path, "not an object");
    WSUP_ASSIGN_OR_RETURN(std::string type, Str(n, "type", path));
    if (type == "Sequence") {
      return Each(n, "pretokenizers", path,
                  [&](const json& e, const std::string& at) { return PreTokenizers(e, at, p); });
    }
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
    } else {
      return Unsupported(path + ".type", type, "Split, ByteLevel, Sequence");
    }
    p->pre_tokenizers.push_back(std::move(out));
    return Status::Ok();
  }

  Status PostProcessor(const json& n, const std::string& path, Pipeline* p) const {
    if (n.is_null()) return Status::Ok();
    if (!n.is_object()) return Bad(path, "not an object");
    WSUP_ASSIGN_OR_RETURN(std::string type, Str(n, "type", path));
    if (type == "ByteLevel") return Status::Ok();  // offsets only: the ids are the same
    if (type == "Sequence") {
      return Each(n, "processors", path, [&](const json& e, const std::string& at) { return PostProcessor(e, at, p); });
    }
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

  Status Decoder(const json& n, const std::string& path, Pipeline* p) const {
    if (!n.is_object()) return Bad(path, "missing: a ByteLevel decoder is needed");
    WSUP_ASSIGN_OR_RETURN(std::string type, Str(n, "type", path));
    if (type != "ByteLevel") return Unsupported(path + ".type", type, "ByteLevel");
    p->decoder_byte_level = true;
    return Status::Ok();
  }

  Status Model(const json& m, const std::string& path, Pipeline* p) const {
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
    auto vocab = m.find("vocab");
    if (vocab == m.end() || !vocab->is_object()) return Bad(path + ".vocab", "missing, or not an object");
    p->vocab.reserve(vocab->size());
    int32_t top = -1;
    for (const auto& [token, id] : vocab->items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX - 1) {
        return Bad(path + ".vocab[\"" + token + "\"]", "not an id (a non-negative integer)");
      }
      const auto v = id.get<int32_t>();
      p->vocab.emplace(token, v);
      top = std::max(top, v);
    }
    p->id_to_token.assign(static_cast<size_t>(top) + 1, "");
    for (const auto& [token, id] : p->vocab) p->id_to_token[id] = token;
    auto merges = m.find("merges");
    if (merges == m.end() || !merges->is_array()) return Bad(path + ".merges", "missing, or not an array");
    p->merges.reserve(merges->size());
    for (size_t r = 0; r < merges->size(); ++r) {
      const json& mj = (*merges)[r];
      std::string left, right;
      if (mj.is_string()) {
        // "a b": the first space separates the pair.
        const std::string s = mj.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos) return Bad(path + ".merges[" + std::to_string(r) + "]", "not \"left right\"");
        left = s.substr(0, sp);
        right = s.substr(sp + 1);
      } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
        left = mj[0].get<std::string>();
        right = mj[1].get<std::string>();
      } else {
        return Bad(path + ".merges[" + std::to_string(r) + "]", "not a pair of tokens");
      }
      auto l = p->vocab.find(left);
      auto rt = p->vocab.find(right);
      auto merged = p->vocab.find(left + right);
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
      auto it = p->vocab.find(unk->get<std::string>());
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
  // GPT-2's bytes_to_unicode: the printable bytes stand for themselves, the
  // rest for the code points from U+0100 on, in byte order.
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
    AppendUtf8(cp, &of_byte[b]);
    byte_of[cp] = static_cast<uint8_t>(b);
  }
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json_text, const std::string& name) {
  // A real tokenizer.json is up to tens of MB (Qwen3's is 11 MB) and nests
  // a few levels.
  auto parsed = ParseJsonChecked(json_text, name, "it should be a Hugging Face tokenizer.json", kMaxTokenizerBytes);
  if (!parsed.ok()) return parsed.error();
  const json& j = *parsed;
  if (!j.is_object()) return InvalidArgument(name + ": not a JSON object; it should be a Hugging Face tokenizer.json");
  Reader r(name);
  auto p = std::make_unique<Pipeline>();
  p->name = name;
  for (const char* key : {"truncation", "padding"}) {
    if (j.contains(key) && !j[key].is_null()) {
      return r.Bad(key, "must be null: the engine decides lengths itself; remove it from the file");
    }
  }
  WSUP_RETURN_IF_ERROR(r.Model(j.contains("model") ? j["model"] : json(), "model", p.get()));
  WSUP_RETURN_IF_ERROR(r.Normalizers(j.value("normalizer", json()), "normalizer", p.get()));
  WSUP_RETURN_IF_ERROR(r.PreTokenizers(j.value("pre_tokenizer", json()), "pre_tokenizer", p.get()));
  WSUP_RETURN_IF_ERROR(r.PostProcessor(j.value("post_processor", json()), "post_processor", p.get()));
  WSUP_RETURN_IF_ERROR(r.Decoder(j.value("decoder", json()), "decoder", p.get()));
  WSUP_RETURN_IF_ERROR(r.Added(j.value("added_tokens", json()), p.get()));
  if (p->byte_level != p->decoder_byte_level) {
    return r.Bad("decoder", "a ByteLevel decoder needs a ByteLevel pre-tokenizer, and the other way round");
  }
  p->size = static_cast<int32_t>(p->id_to_token.size());
  for (const AddedToken& t : p->added) p->size = std::max(p->size, t.id + 1);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(p)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  auto text = ReadFile(path, kMaxTokenizerBytes);
  if (!text.ok()) return text.error();
  return FromJson(*text, path);
}

}  // namespace wsup::text
