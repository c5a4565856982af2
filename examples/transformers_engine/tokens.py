"""Text <-> token ids for the example engine.

Two tokenizers sit behind one small interface (encode(text) -> ids,
decode(ids) -> text):

- ByteTokenizer: one token per UTF-8 byte of the prompt, no special tokens;
  token id t renders as the character U+00tt (ids past U+10FFFF or in the
  surrogate range as U+FFFD). It is the reference engine's tokenizer
  (engine/tokenizer.h), the one the test checkpoints' golden outputs were
  made with. The engine uses it when the model folder has no tokenizer.
  Either way the engine reports a prompt's ids (prompt_token_ids) when asked
  for token ids: the front resumes a cut stream from them, never from a
  guess.
- HFTokenizer (model.py): a Hugging Face tokenizer from the model folder.

IncrementalDecoder turns a growing list of ids into text pieces for stream
chunks: the text of all ids so far minus what was already sent, holding back
a piece that ends inside a character (an incomplete multi-byte sequence
decodes to U+FFFD) until the next id completes it.

Pure Python; no torch. Any thread (each request has its own decoder).
"""

import api

REPLACEMENT = "\ufffd"


def token_text(token):
    """The text of one byte-tokenizer id."""
    if token < 0 or token > 0x10FFFF or 0xD800 <= token <= 0xDFFF:
        return REPLACEMENT
    return chr(token)


class ByteTokenizer:
    name = "bytes"

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return "".join(token_text(t) for t in ids)

    def incremental(self):
        # Every id is a whole character: nothing is ever held back.
        return _ByteDecoder()

    def render_chat(self, messages, add_generation_prompt, extra):
        raise api.ApiError("the model has no tokenizer of its own and so no chat template; send a completion "
                           "with a prompt instead")


class _ByteDecoder:
    def push(self, ids):
        return "".join(token_text(t) for t in ids)

    def flush(self):
        return ""


class IncrementalDecoder:
    """For tokenizers whose tokens are not whole characters."""

    def __init__(self, decode):
        self._decode = decode
        self._ids = []
        self._sent = ""

    def push(self, ids):
        self._ids.extend(ids)
        text = self._decode(self._ids)
        if text.endswith(REPLACEMENT):
            return ""  # a character split across tokens: wait for the rest
        return self._take(text)

    def flush(self):
        return self._take(self._decode(self._ids))

    def _take(self, text):
        # What was sent cannot be taken back: should the tokenizer render the
        # earlier text differently now (a clean-up rule), only the length
        # sent so far is skipped.
        piece = text[len(self._sent):]
        self._sent = text
        return piece
