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
chunks and answers: the text of the prompt's last ids and all new ids, minus
what was already sent, holding back the end of a piece that stops inside a
character (an incomplete multi-byte sequence decodes to U+FFFD) until the
next id completes it.

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

    def incremental(self, context=()):
        # Every id is a whole character: nothing is ever held back, and the
        # prompt does not change the text of the next id.
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
    """For tokenizers whose tokens are not whole characters.

    Primed with the last ids of the prompt, as vLLM's incremental
    detokenizer is: a continuation's prompt may end inside a character (the
    stream was cut between the tokens of one character), and the first new
    id then completes it. Each piece is the text that is certain so far:
    everything but a trailing run of U+FFFD, which may be the start of a
    character the next id completes. The same rule holds back the same text
    in an uninterrupted stream and in its continuation, so the two read
    alike."""

    CONTEXT = 5  # ids of the prompt decoded with the output: enough for any split character

    def __init__(self, decode, context=()):
        self._decode = decode
        self._ids = list(context)[-self.CONTEXT:]
        self._sent = _certain(decode(self._ids)) if self._ids else ""

    def push(self, ids):
        self._ids.extend(ids)
        return self._take(_certain(self._decode(self._ids)))

    def flush(self):
        return self._take(self._decode(self._ids))

    def _take(self, text):
        # What was sent cannot be taken back: should the tokenizer render the
        # earlier text differently now (a clean-up rule), only the length
        # sent so far is skipped.
        if len(text) <= len(self._sent):
            return ""
        piece = text[len(self._sent):]
        self._sent = text
        return piece


def _certain(text):
    return text.rstrip(REPLACEMENT)
