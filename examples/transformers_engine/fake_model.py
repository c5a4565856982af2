"""A deterministic stand-in for the transformers model, FOR TESTS ONLY
(`server.py --model-impl fake`): CI has no torch, and the HTTP layer,
streaming, cancellation, draining, bad input and the engine's life under
the supervisor are tested with real processes on this model.

The next token is a function of the whole sequence so far (prompt and the
tokens generated before it), as a language model's greedy choice is, so a
stream that the front resumes on another engine (prompt + delivered tokens)
continues exactly as the uninterrupted run would: tests can check resume
token for token.

Weights: with --weight-cache client|daemon and --layout checkpoint it
attaches the holder's checkpoint arena through the Python client (host
backend, numpy only) and keeps the attachment for its lifetime, so
weights.source reports "holder" (or "disk" with the reason) exactly as the
real model does; it computes nothing from the tensors. It makes no
engine-made layouts.

Same interface as model.TransformersModel: name, impl, vocab_size,
context, eos_ids, tokenizer, device, weights (the /wsup/status weights
object), phases, generate().
"""

import os
import random
import time

from tokens import ByteTokenizer


FNV_OFFSET = 0x811C9DC5
FNV_PRIME = 0x01000193


def absorb(state, token):
    """The sequence's state after one more token (FNV-1a over the ids): a
    function of every token so far, kept incrementally so a step costs O(1)."""
    return ((state ^ (token & 0xFFFFFFFF)) * FNV_PRIME) & 0xFFFFFFFF


def choose(state, vocab):
    """The greedy choice for a sequence in `state` (its bits mixed, so that
    neighbouring states choose unrelated tokens)."""
    x = state
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    return (x ^ (x >> 16)) % vocab


def greedy(prompt, max_tokens, vocab=256):
    """What the fake model answers at temperature 0 (tests compute their
    expectations with it)."""
    state = FNV_OFFSET
    for t in prompt:
        state = absorb(state, t)
    out = []
    for _ in range(max_tokens):
        t = choose(state, vocab)
        out.append(t)
        state = absorb(state, t)
    return out


class FakeModel:
    impl = "fake"

    def __init__(self, opts, client_loader=None):
        """opts: the server's parsed flags. client_loader() -> the
        wsup_client module (imported only when a holder is used)."""
        self.name = opts.model_name or os.path.basename(os.path.normpath(opts.model))
        self.vocab_size = opts.fake_vocab
        self.context = opts.fake_context
        self.eos_ids = set(opts.fake_eos)
        self.tokenizer = ByteTokenizer()
        self.device = "cpu"
        self.delay_s = opts.fake_token_delay_ms / 1000.0
        self.weights = {"mode": opts.weight_cache, "layout": opts.layout}
        self.phases = []
        self._keep = None  # the attachment, alive as long as the model
        t0 = time.monotonic()
        if opts.weight_cache == "off":
            self.weights.update(source="disk", miss_reason="mode off")
        else:
            self._attach(opts, client_loader())
        ms = (time.monotonic() - t0) * 1000.0
        self.weights.setdefault("attach_ms", 0.0)
        self.weights.setdefault("load_ms", 0.0)
        self.weights["ms"] = self.weights["attach_ms"] + self.weights["load_ms"]
        self.phases.append(("weights", ms, "%s, mode %s (fake model)" % (self.weights["source"], opts.weight_cache)))
        if opts.fake_load_ms > 0:  # a slow load, for tests of the starting state
            time.sleep(opts.fake_load_ms / 1000.0)
            self.phases.append(("warmup", float(opts.fake_load_ms), "fake load time"))

    def _attach(self, opts, wsup_client):
        att = wsup_client.attach(opts.socket, opts.weight_cache, checkpoint_dir=opts.model, backend="host",
                                 revision=opts.revision, client_name="wsup-transformers-example (fake)")
        if att.from_holder:
            self._keep = att
            self.weights.update(source="holder", attach_ms=att.attach_ms, tensors=len(att),
                                bytes=sum(att.info(n).nbytes for n in att.names()))
        else:
            self.weights.update(source="disk", miss_reason=att.reason)
            if att.diffs:
                self.weights["diffs"] = att.diffs

    def generate(self, prompt, max_tokens, temperature=0.0, seed=None):
        state = FNV_OFFSET
        for t in prompt:
            state = absorb(state, t)
        rng = random.Random(seed) if temperature > 0 else None
        for _ in range(max_tokens):
            if self.delay_s > 0:
                time.sleep(self.delay_s)  # a model's step time, so tests can cut requests mid-generation
            t = choose(state, self.vocab_size)
            if rng is not None:
                t = (t + rng.randrange(self.vocab_size)) % self.vocab_size
            state = absorb(state, t)
            yield t
