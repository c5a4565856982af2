// Tokenizer: a checkpoint's own tokenizer, read from its tokenizer.json (the
// Hugging Face tokenizers format), encoding text to the ids the model was
// trained on and decoding ids back to text, exactly as the reference
// library does for the files it reads.
//
// What it reads (anything else refuses the load, naming the JSON path and
// what is supported; it never falls back silently):
//   model            BPE (byte-level, or with byte_fallback: SentencePiece's
//                    kind, Llama-2 and Mistral), ignore_merges, fuse_unk
//   normalizer       null, NFC, NFD, NFKC, NFKD, Replace, Prepend, Sequence
//   pre_tokenizer    null, Split (Isolated or Removed), ByteLevel,
//                    Metaspace (prepend_scheme, split), Sequence
//   post_processor   ByteLevel, TemplateProcessing (single), Sequence
//   decoder          ByteLevel (with a ByteLevel pre-tokenizer); Metaspace;
//                    or a Sequence of Replace, ByteFallback, Fuse and Strip
//   added_tokens     matched leftmost-longest, before the normalizer for
//                    the tokens marked `normalized: false`, after it for
//                    the others; lstrip and rstrip
//
// Text that is not UTF-8 is first made so (utf8.h): each ill-formed subpart
// becomes U+FFFD, as a client's JSON decoder would have done.
//
// A Tokenizer is immutable after Load(): Encode() and Decode() may run on
// any thread at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace wsup::text {

class Tokenizer {
 public:
  // tokenizer.json at `path`.
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  // The same from the file's text; `name` names it in errors.
  static Result<std::unique_ptr<Tokenizer>> FromJson(std::string_view json_text, const std::string& name);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // add_special_tokens: the post-processor's tokens (a BOS, say), as the
  // reference's encode(text, add_special_tokens) does. Special tokens
  // written in the text are always their own ids.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const;
  // skip_special_tokens: the added tokens marked special are left out.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;

  // The bytes token `id` contributes to a decode (empty for an id the
  // tokenizer does not have, or a special one skipped). For a byte-level
  // tokenizer Decode() is these bytes, concatenated, made valid UTF-8; a
  // SentencePiece one also strips the text's first space and decodes a run
  // of byte tokens that is not UTF-8 as one U+FFFD per byte.
  std::string TokenBytes(int32_t id, bool skip_special_tokens) const;

  // The highest id plus one (the vocabulary and the added tokens).
  int32_t vocab_size() const;
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token's text as the file writes it; nullopt for an unknown id.
  std::optional<std::string> IdToToken(int32_t id) const;
  bool IsSpecial(int32_t id) const;
  // "BPE byte-level, 151669 ids, 26 added (14 special)".
  std::string Describe() const;

  struct Pipeline;

 private:
  friend class StreamDecoder;
  explicit Tokenizer(std::unique_ptr<Pipeline> p);
  std::unique_ptr<Pipeline> p_;
};

// Streamed decoding: the text of each new id, never part of a character,
// and the pieces concatenated (with Finish()'s) equal Decode() of all ids.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);
  // The text id completes (may be empty while a character is incomplete).
  std::string Add(int32_t id);
  // What is left at the end (an incomplete character, as U+FFFD).
  std::string Finish();
  // The stream goes on after `context` (the tokens before the first Add:
  // a prompt, or a resumed stream's prompt and delivered tokens). The bytes
  // of its end that stop inside a character are held, so that the new ids
  // complete or break that character as one stream over the whole sequence
  // would: a stream cut and continued elsewhere reads the same.
  void Prime(const std::vector<int32_t>& context);

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  // Byte-level: the bytes of an incomplete character. SentencePiece: a run
  // of byte tokens not yet ended.
  std::string pending_;
  int strip_left_ = 0;  // SentencePiece: spaces the Strip may still remove
};

}  // namespace wsup::text
