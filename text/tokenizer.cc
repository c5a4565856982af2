// Encoding and decoding (tokenizer.h); the file is read in tokenizer_load.cc.
#include "text/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <queue>
#include <utility>

#include "text/pipeline.h"
#include "text/utf8.h"

namespace wsup::text {

namespace {

using Pipeline = Tokenizer::Pipeline;

bool IsAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

std::string UnicodeNormalize(std::string_view s, Normalizer::Kind kind) {
  // ASCII is the same in every normal form.
  if (IsAscii(s)) return std::string(s);
  int options = UTF8PROC_STABLE;
  switch (kind) {
    case Normalizer::Kind::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case Normalizer::Kind::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case Normalizer::Kind::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case Normalizer::Kind::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
    default:
      return std::string(s);
  }
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &out,
                                          static_cast<utf8proc_option_t>(options));
  // The text is valid UTF-8 here; a failure (out of memory) keeps it as it is.
  if (n < 0 || !out) return std::string(s);
  std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

void ReplaceAll(std::string* s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t at = 0;
  while (true) {
    const size_t hit = s->find(from, at);
    if (hit == std::string::npos) break;
    out.append(*s, at, hit - at);
    out += to;
    at = hit + from.size();
  }
  if (at == 0) return;
  out.append(*s, at, std::string::npos);
  *s = std::move(out);
}

std::string Normalize(const Pipeline& p, std::string_view s) {
  std::string t(s);
  for (const Normalizer& n : p.normalizers) {
    switch (n.kind) {
      case Normalizer::Kind::kReplace:
        ReplaceAll(&t, n.pattern, n.content);
        break;
      case Normalizer::Kind::kPrepend:
        if (!t.empty()) t = n.content + t;
        break;
      default:
        t = UnicodeNormalize(t, n.kind);
        break;
    }
  }
  return t;
}

// One run of text: either an added token's id, or text to encode.
struct Segment {
  std::string_view text;
  int32_t added_id = -1;
};

bool IsSpaceByte(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Splits `s` on the added tokens `which` (longest first), leftmost-longest,
// as the reference's Aho-Corasick match does.
void SplitOnAdded(const Pipeline& p, const Pipeline::AddedIndex& which, std::string_view s,
                  std::vector<Segment>* out) {
  if (which.empty) {
    if (!s.empty()) out->push_back({s, -1});
    return;
  }
  size_t start = 0;  // of the text not yet emitted
  size_t i = 0;
  while (i < s.size()) {
    const AddedToken* hit = nullptr;
    for (size_t k : which.by_first[static_cast<unsigned char>(s[i])]) {
      const AddedToken& t = p.added[k];
      if (t.content.size() <= s.size() - i && s.compare(i, t.content.size(), t.content) == 0) {
        hit = &t;  // the longest, as `which` is longest first
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t begin = i;
    size_t end = i + hit->content.size();
    if (hit->lstrip) {
      while (begin > start && IsSpaceByte(s[begin - 1])) --begin;
    }
    if (hit->rstrip) {
      while (end < s.size() && IsSpaceByte(s[end])) ++end;
    }
    if (begin > start) out->push_back({s.substr(start, begin - start), -1});
    out->push_back({s.substr(begin, end - begin), hit->id});
    start = end;
    i = end;
  }
  if (start < s.size()) out->push_back({s.substr(start), -1});
}

// Metaspace over one piece: spaces become the replacement, which goes
// first where the scheme says, and (split) starts a new piece each time.
void Metaspace(const PreTokenizer& pt, std::string piece, bool starts_input, std::vector<std::string>* next) {
  const std::string& rep = pt.replacement;
  ReplaceAll(&piece, " ", rep);
  const bool prepend = pt.prepend == PreTokenizer::Prepend::kAlways ||
                       (pt.prepend == PreTokenizer::Prepend::kFirst && starts_input);
  if (prepend && piece.compare(0, rep.size(), rep) != 0) piece.insert(0, rep);
  if (!pt.split) {
    next->push_back(std::move(piece));
    return;
  }
  size_t begin = 0;
  for (size_t at = piece.find(rep, 1); at != std::string::npos; at = piece.find(rep, at + rep.size())) {
    next->push_back(piece.substr(begin, at - begin));
    begin = at;
  }
  next->push_back(piece.substr(begin));
}

// The pre-tokenizers over one normalized run: the pieces the model encodes.
// starts_input: the run is the start of the text encoded (Metaspace's
// "first" scheme).
std::vector<std::string> PreTokenize(const Pipeline& p, std::string text, bool starts_input) {
  std::vector<std::string> pieces;
  pieces.push_back(std::move(text));
  for (const PreTokenizer& pt : p.pre_tokenizers) {
    std::vector<std::string> next;
    next.reserve(pieces.size() * 2);
    if (pt.kind == PreTokenizer::Kind::kMetaspace) {
      for (size_t k = 0; k < pieces.size(); ++k) Metaspace(pt, std::move(pieces[k]), starts_input && k == 0, &next);
    } else if (pt.kind == PreTokenizer::Kind::kSplit) {
      for (const std::string& piece : pieces) {
        size_t gap = 0;
        pt.regex[0].FindAll(piece, [&](size_t b, size_t e) {
          if (b > gap) next.push_back(piece.substr(gap, b - gap));
          if (pt.behavior == PreTokenizer::Behavior::kIsolated) next.push_back(piece.substr(b, e - b));
          gap = e;
        });
        if (gap < piece.size()) next.push_back(piece.substr(gap));
      }
    } else {  // kByteLevel
      for (std::string& piece : pieces) {
        if (pt.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(piece.begin(), ' ');
        auto map = [&](std::string_view part) {
          std::string m;
          m.reserve(part.size() * 2);
          for (char c : part) m += p.bytes.of_byte[static_cast<unsigned char>(c)];
          next.push_back(std::move(m));
        };
        if (pt.use_regex) {
          size_t gap = 0;
          p.gpt2[0].FindAll(piece, [&](size_t b, size_t e) {
            if (b > gap) map(std::string_view(piece).substr(gap, b - gap));
            map(std::string_view(piece).substr(b, e - b));
            gap = e;
          });
          if (gap < piece.size()) map(std::string_view(piece).substr(gap));
        } else {
          map(piece);
        }
      }
    }
    pieces = std::move(next);
  }
  return pieces;
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Merges a long run of symbols (a SentencePiece file does not split the
// text: a whole prompt is one piece) in O(n log n): the candidate pairs in
// a heap, lowest rank first and the leftmost of equal ones, as the short
// loop in Bpe() picks them; an entry whose pair has changed since is
// dropped when it comes up.
void MergeLong(const Pipeline& p, std::vector<int32_t>* syms) {
  const size_t n = syms->size();
  std::vector<int32_t>& id = *syms;
  std::vector<int64_t> next(n), prev(n);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int64_t>(i) + 1 : -1;
  }
  struct Candidate {
    uint64_t order;  // rank << 32 | position: the smallest first
    int32_t left, right;
    bool operator>(const Candidate& o) const { return order > o.order; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto offer = [&](int64_t i) {
    if (i < 0 || next[i] < 0) return;
    auto it = p.merges.find(PairKey(id[i], id[next[i]]));
    if (it == p.merges.end()) return;
    heap.push({(it->second & 0xFFFFFFFF00000000u) | static_cast<uint32_t>(i), id[i], id[next[i]]});
  };
  for (size_t i = 0; i + 1 < n; ++i) offer(static_cast<int64_t>(i));
  std::vector<bool> gone(n, false);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const auto i = static_cast<int64_t>(c.order & 0xFFFFFFFFu);
    if (gone[i] || next[i] < 0 || id[i] != c.left || id[next[i]] != c.right) continue;
    const int64_t j = next[i];
    id[i] = static_cast<int32_t>(p.merges.find(PairKey(c.left, c.right))->second & 0xFFFFFFFFu);
    gone[j] = true;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    offer(prev[i]);
    offer(i);
  }
  size_t out = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!gone[i]) id[out++] = id[i];
  }
  id.resize(out);
}

// BPE over one piece: its characters, merged pair by pair, the pair of
// lowest rank first, the leftmost of equal ones.
void Bpe(const Pipeline& p, const std::string& word, std::vector<int32_t>* out) {
  if (word.empty()) return;
  if (p.ignore_merges) {
    auto it = p.vocab.find(absl::string_view(word));
    if (it != p.vocab.end()) {
      out->push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> syms;
  syms.reserve(word.size());
  bool last_unk = false;
  size_t i = 0;
  while (i < word.size()) {
    size_t n = WellFormedAt(word, i);
    if (n == 0) n = 1;
    // Debian's Abseil has its own string_view, not an alias of std's.
    auto it = p.vocab.find(absl::string_view(word.data() + i, n));
    const size_t at = i;
    i += n;
    if (it != p.vocab.end()) {
      syms.push_back(it->second);
      last_unk = false;
      continue;
    }
    if (p.byte_fallback) {
      // Every byte as its "<0xXX>" token, or (one missing) the character
      // is unknown.
      static constexpr char kHex[] = "0123456789ABCDEF";
      const size_t had = syms.size();
      bool all = true;
      for (size_t k = 0; k < n && all; ++k) {
        const auto b = static_cast<unsigned char>(word[at + k]);
        const std::string name = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
        auto bt = p.vocab.find(absl::string_view(name));
        all = bt != p.vocab.end();
        if (all) syms.push_back(bt->second);
      }
      if (all) {
        last_unk = false;
        continue;
      }
      syms.resize(had);
    }
    if (p.unk_id >= 0 && !(p.fuse_unk && last_unk)) syms.push_back(p.unk_id);
    last_unk = true;
  }
  if (syms.size() > 64) {
    MergeLong(p, &syms);
    out->insert(out->end(), syms.begin(), syms.end());
    return;
  }
  while (syms.size() > 1) {
    uint64_t best = UINT64_MAX;
    size_t at = 0;
    for (size_t k = 0; k + 1 < syms.size(); ++k) {
      auto it = p.merges.find(PairKey(syms[k], syms[k + 1]));
      if (it != p.merges.end() && it->second < best) {
        best = it->second;
        at = k;
      }
    }
    if (best == UINT64_MAX) break;
    syms[at] = static_cast<int32_t>(best & 0xFFFFFFFFu);
    syms.erase(syms.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  out->insert(out->end(), syms.begin(), syms.end());
}

void EncodeNormalized(const Pipeline& p, std::string_view raw, bool starts_input, std::vector<int32_t>* out) {
  const std::string norm = Normalize(p, raw);
  std::vector<Segment> segs;
  SplitOnAdded(p, p.norm_added, norm, &segs);
  for (const Segment& s : segs) {
    if (s.added_id >= 0) {
      out->push_back(s.added_id);
      continue;
    }
    const bool first = starts_input && s.text.data() == norm.data();
    for (const std::string& piece : PreTokenize(p, std::string(s.text), first)) Bpe(p, piece, out);
  }
}

// ---- SentencePiece's decoder (pipeline.h: decode_replace ... strip_start)

// A "<0xXX>" token's byte, or -1.
int FallbackByte(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string Replaced(const Pipeline& p, std::string token) {
  for (const auto& [from, to] : p.decode_replace) ReplaceAll(&token, from, to);
  return token;
}

// Ends a run of byte tokens: its bytes where they are UTF-8, else one
// U+FFFD for each of them (the reference's ByteFallback).
void EndByteRun(std::string* run, std::string* out) {
  if (run->empty()) return;
  if (IsValidUtf8(*run)) {
    out->append(*run);
  } else {
    for (size_t i = 0; i < run->size(); ++i) out->append("\xEF\xBF\xBD");
  }
  run->clear();
}

// Text that is now certain, after the Strip of the whole text's first
// spaces (`strip_left` of them still to remove, 0 once other text came).
void EmitPiece(std::string text, int* strip_left, std::string* out) {
  while (*strip_left > 0 && !text.empty()) {
    if (text[0] == ' ') {
      text.erase(0, 1);
      --*strip_left;
    } else {
      *strip_left = 0;
    }
  }
  out->append(text);
}

// One token's share of the decode: a byte token joins the run; any other
// ends it and adds its text.
void AddPiece(const Pipeline& p, const std::string& token, std::string* run, int* strip_left, std::string* out) {
  std::string text = Replaced(p, token);
  if (p.decode_byte_fallback) {
    const int b = FallbackByte(text);
    if (b >= 0) {
      run->push_back(static_cast<char>(b));
      return;
    }
  }
  std::string piece;
  EndByteRun(run, &piece);
  piece += text;
  EmitPiece(std::move(piece), strip_left, out);
}

void FinishPieces(std::string* run, int* strip_left, std::string* out) {
  std::string piece;
  EndByteRun(run, &piece);
  EmitPiece(std::move(piece), strip_left, out);
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Pipeline> p) : p_(std::move(p)) {}
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::string valid;
  if (!IsValidUtf8(text)) {
    valid = ToValidUtf8(text);
    text = valid;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), p_->prefix_ids.begin(), p_->prefix_ids.end());
  std::vector<Segment> segs;
  SplitOnAdded(*p_, p_->raw_added, text, &segs);
  for (const Segment& s : segs) {
    if (s.added_id >= 0) {
      ids.push_back(s.added_id);
    } else {
      EncodeNormalized(*p_, s.text, s.text.data() == text.data(), &ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), p_->suffix_ids.begin(), p_->suffix_ids.end());
  return ids;
}

std::string Tokenizer::TokenBytes(int32_t id, bool skip_special_tokens) const {
  std::optional<std::string> token = IdToToken(id);
  if (!token) return "";
  if (skip_special_tokens && IsSpecial(id)) return "";
  if (!p_->byte_level) {
    std::string text = Replaced(*p_, *token);
    const int b = p_->decode_byte_fallback ? FallbackByte(text) : -1;
    return b >= 0 ? std::string(1, static_cast<char>(b)) : text;
  }
  // Each character back to its byte; a token with a character outside the
  // alphabet (an added token such as DeepSeek's) is its own UTF-8.
  std::string out;
  out.reserve(token->size());
  size_t i = 0;
  while (i < token->size()) {
    const size_t n = WellFormedAt(*token, i);
    if (n == 0) return *token;
    const char32_t cp = CodePointAt(*token, i, n);
    const int b = cp < p_->bytes.byte_of.size() ? p_->bytes.byte_of[cp] : -1;
    if (b < 0) return *token;
    out.push_back(static_cast<char>(b));
    i += n;
  }
  return out;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  if (!p_->byte_level) {
    std::string out, run;
    int strip_left = p_->strip_start;
    for (int32_t id : ids) {
      std::optional<std::string> token = IdToToken(id);
      if (!token || (skip_special_tokens && IsSpecial(id))) continue;
      AddPiece(*p_, *token, &run, &strip_left, &out);
    }
    FinishPieces(&run, &strip_left, &out);
    return out;
  }
  std::string bytes;
  for (int32_t id : ids) bytes += TokenBytes(id, skip_special_tokens);
  return ToValidUtf8(bytes);
}

int32_t Tokenizer::vocab_size() const { return p_->size; }

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  for (const AddedToken& t : p_->added) {
    if (t.content == token) return t.id;
  }
  auto it = p_->vocab.find(absl::string_view(token.data(), token.size()));
  if (it == p_->vocab.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  auto a = p_->added_by_id.find(id);
  if (a != p_->added_by_id.end()) return p_->added[a->second].content;
  if (id < 0 || static_cast<size_t>(id) >= p_->id_to_token.size() || p_->id_to_token[id].empty()) return std::nullopt;
  return std::string(p_->id_to_token[id]);
}

bool Tokenizer::IsSpecial(int32_t id) const {
  auto a = p_->added_by_id.find(id);
  return a != p_->added_by_id.end() && p_->added[a->second].special;
}

std::string Tokenizer::Describe() const {
  size_t special = 0;
  for (const AddedToken& t : p_->added) special += t.special ? 1 : 0;
  return std::string("BPE") + (p_->byte_level ? " byte-level" : p_->byte_fallback ? " with byte fallback" : "") + ", " + std::to_string(p_->size) + " ids, " +
         std::to_string(p_->added.size()) + " added (" + std::to_string(special) + " special)";
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens), strip_left_(tokenizer.p_->strip_start) {}

std::string StreamDecoder::Add(int32_t id) {
  const Pipeline& p = *tokenizer_.p_;
  if (!p.byte_level) {
    // A run of byte tokens is held whole until it ends: the reference
    // decodes it as one (U+FFFD for each byte if any of it is not UTF-8).
    std::optional<std::string> token = tokenizer_.IdToToken(id);
    std::string out;
    if (token && !(skip_special_ && tokenizer_.IsSpecial(id))) AddPiece(p, *token, &pending_, &strip_left_, &out);
    return out;
  }
  pending_ += tokenizer_.TokenBytes(id, skip_special_);
  const size_t hold = IncompleteTail(pending_);
  std::string out = ToValidUtf8(std::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return out;
}

void StreamDecoder::Prime(const std::vector<int32_t>& context) {
  if (!tokenizer_.p_->byte_level) {
    // The whole context: whether any text came before (the Strip is done)
    // and the run of byte tokens it ends with.
    pending_.clear();
    strip_left_ = tokenizer_.p_->strip_start;
    for (int32_t id : context) Add(id);
    return;
  }
  // A character is at most 4 bytes, and every token gives at least one
  // byte unless it is skipped: the last 8 tokens hold its start.
  std::string tail;
  for (size_t i = context.size() > 8 ? context.size() - 8 : 0; i < context.size(); ++i) {
    tail += tokenizer_.TokenBytes(context[i], skip_special_);
  }
  pending_ = tail.substr(tail.size() - IncompleteTail(tail));
}

std::string StreamDecoder::Finish() {
  std::string out;
  if (!tokenizer_.p_->byte_level) {
    FinishPieces(&pending_, &strip_left_, &out);
    return out;
  }
  out = ToValidUtf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace wsup::text
