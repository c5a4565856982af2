// The parts of a Tokenizer (tokenizer.h), as tokenizer_load.cc reads them
// from tokenizer.json and tokenizer.cc runs them. Internal to text/.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>

#include <absl/container/flat_hash_map.h>
#include <vector>

#include "text/regex.h"
#include "text/tokenizer.h"

namespace wsup::text {

struct Normalizer {
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kReplace, kPrepend };
  Kind kind = Kind::kNfc;
  std::string pattern;  // kReplace: the string replaced
  std::string content;  // kReplace: what replaces it; kPrepend: what goes first
};

struct PreTokenizer {
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  enum class Behavior { kIsolated, kRemoved };
  // kMetaspace: where the replacement goes before a piece (kFirst: only the
  // piece that starts the input).
  enum class Prepend { kAlways, kFirst, kNever };
  Kind kind = Kind::kSplit;
  std::vector<Regex> regex;  // kSplit: one pattern (a vector: Regex has no default)
  Behavior behavior = Behavior::kIsolated;
  bool add_prefix_space = false;  // kByteLevel
  bool use_regex = false;         // kByteLevel: GPT-2's split first
  std::string replacement;        // kMetaspace: what a space becomes ("▁")
  Prepend prepend = Prepend::kAlways;
  bool split = true;              // kMetaspace: each replacement starts a piece
};

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool lstrip = false, rstrip = false, normalized = false, special = false;
};

// The byte-level alphabet: each byte is a printable character (GPT-2's
// bytes_to_unicode), so a vocabulary of strings covers every byte.
struct ByteAlphabet {
  std::string of_byte[256];  // the UTF-8 of the character for each byte
  // The byte of each character of the alphabet (all below U+0144), -1 for
  // the others.
  std::array<int16_t, 0x144> byte_of;
  ByteAlphabet();
};

struct Tokenizer::Pipeline {
  // model: BPE
  // Each token's text once, as the file lists them (never resized after the
  // load: the views below point into it).
  std::vector<std::pair<std::string, int32_t>> tokens;
  absl::flat_hash_map<absl::string_view, int32_t> vocab;
  std::vector<absl::string_view> id_to_token;  // empty for an id with no token
  // (left id << 32 | right id) -> rank << 32 | merged id
  absl::flat_hash_map<uint64_t, uint64_t> merges;
  bool ignore_merges = false;
  bool byte_fallback = false;
  int32_t unk_id = -1;
  // A ByteLevel pre-tokenizer maps the text (and the ByteLevel decoder,
  // which a load requires with it, maps it back).
  bool byte_level = false;
  // fuse_unk: a run of characters the vocabulary lacks is one unk_id.
  bool fuse_unk = false;

  // The decoder of a tokenizer that is not byte-level (SentencePiece's
  // kind: Llama-2, Mistral): each token's text with `decode_replace`
  // applied in order; then, with ByteFallback, each run of "<0xXX>" tokens
  // as its bytes (one U+FFFD per byte where the run is not UTF-8); the
  // pieces joined (Fuse); then up to `strip_start` leading spaces of the
  // whole text removed (Strip).
  std::vector<std::pair<std::string, std::string>> decode_replace;
  bool decode_byte_fallback = false;
  int strip_start = 0;

  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre_tokenizers;
  // The post-processor's ids for one sequence: before and after it.
  std::vector<int32_t> prefix_ids, suffix_ids;

  std::vector<AddedToken> added;             // in the file's order
  // Indexes into `added`, longest first, by the first byte of their text:
  // most bytes of a text start no added token and cost one lookup.
  struct AddedIndex {
    std::vector<size_t> by_first[256];
    bool empty = true;
  };
  AddedIndex raw_added, norm_added;
  std::unordered_map<int32_t, size_t> added_by_id;
  int32_t size = 0;  // the highest id plus one

  ByteAlphabet bytes;
  // The GPT-2 split, for a ByteLevel pre-tokenizer with use_regex.
  std::vector<Regex> gpt2;
};

}  // namespace wsup::text
