"""The transformers side of the example engine: where the weights come from
(a holder's engine-made layout, a holder's checkpoint arena, or the disk),
and greedy or sampled generation one token at a time.

Weights (acquire()), by --weight-cache and --layout:

| mode, layout | holder has it | holder has nothing | no holder / other weights |
|---|---|---|---|
| off | - | - | from_pretrained; source "disk" |
| client/daemon, engine | build on the meta device, bind the layout's tensors; source "holder" | lease: from_pretrained inside the lease's torch pool (the load writes into the holder's memory), commit the state_dict; source "published" | client: from_pretrained, source "disk", miss_reason = the holder's reason; daemon: the engine exits |
| client/daemon, checkpoint | build on the meta device, bind the checkpoint's tensors; source "holder" | - | as above |

Binding checkpoint tensors works for models whose modules use the
checkpoint's own names and shapes (Llama). transformers 5 fuses the experts
of MoE models at load time (`mlp.experts.gate_up_proj`), so their modules do
not match their checkpoint's tensors: use --layout engine for them, where
the layout holds what the loaded model holds.

The attachment or publication is kept (self._keep) as long as the model: the
bound parameters are the holder's memory.

Generation: one sequence per request with its own KV cache (a
DynamicCache); forwards of concurrent requests are serialized by one lock,
so requests interleave token by token (no batching: this is an example, not
a fast engine). temperature 0 is greedy (argmax, ties to the lowest id, as
transformers' own greedy search); above 0, softmax sampling from a
generator seeded per request.

torch and transformers are imported only inside the functions that need
them: the weight logic (acquire) is tested without either, with stand-ins
for the client and the torch operations (tests/python/test_example_engine.py).
"""

import json
import os
import threading
import time

import api
from tokens import ByteTokenizer, IncrementalDecoder

ENGINE_NAME = "wsup-transformers-example"
VERSION = "0.1.0"

EXIT_FAILURE = 1
EXIT_REFUSED = 78


class LoadError(Exception):
    """The model cannot be served; exit_code 78 when restarting unchanged
    cannot help (the supervisor does not restart such an engine)."""

    def __init__(self, message, exit_code=EXIT_FAILURE):
        super().__init__(message)
        self.exit_code = exit_code


def _ms(t0):
    return (time.monotonic() - t0) * 1000.0


def acquire(opts, ops, client):
    """Loads the model's weights by opts.weight_cache / opts.layout.

    ops: the torch operations (TorchOps, or a test's stand-in):
      build_on_meta() -> module without memory for its weights
      from_pretrained() -> module loaded from disk on the device
      state_dict(module), nbytes(module), tensors(attachment) -> {name: tensor}
      transform (str), backend ("cuda" | "host"), device_index (int)
    client: the wsup_client module (None when the mode is off).

    Returns (module, weights, keep): weights is the /wsup/status "weights"
    object; keep holds what the module's memory depends on."""
    w = {"mode": opts.weight_cache, "layout": opts.layout}
    keep = ()
    if opts.weight_cache == "off":
        t0 = time.monotonic()
        module = ops.from_pretrained()
        w.update(source="disk", miss_reason="mode off", attach_ms=0.0, load_ms=_ms(t0))
    elif opts.layout == "engine":
        module, keep = _engine_layout(opts, ops, client, w)
    else:
        module, keep = _checkpoint_layout(opts, ops, client, w)
    w["ms"] = w["attach_ms"] + w["load_ms"]
    w["bytes"] = ops.nbytes(module)
    return module, w, keep


def _engine_layout(opts, ops, client, w):
    if not hasattr(client, "publish"):
        raise LoadError("--layout engine: this wsup_client (%s) has no publish(); install the client of this "
                        "wsup, or use --layout checkpoint" % getattr(client, "__file__", client), EXIT_REFUSED)
    engine = {"name": ENGINE_NAME, "version": VERSION, "transform": ops.transform}
    kw = {}
    if opts.revision:  # part of the fingerprint, as for attach (and as the holder got it)
        kw["revision"] = opts.revision
    t0 = time.monotonic()
    pub = client.publish(opts.socket, opts.weight_cache, checkpoint_dir=opts.model, engine=engine,
                         backend=ops.backend, device=ops.device_index, **kw)
    if pub.attached:
        att = pub.attachment
        attached_ms = _ms(t0)
        t1 = time.monotonic()
        module = ops.build_on_meta()
        client.bind_module(module, ops.tensors(att))
        w.update(source="holder", attach_ms=attached_ms + _ms(t1), load_ms=0.0)
        return module, (pub, att)
    if pub.has_lease:
        # Nobody has this layout: this engine makes it. from_pretrained
        # allocates every tensor from the lease's memory, so what the model
        # computes from is what the holder will serve to the next engine.
        with pub.torch_pool():
            module = ops.from_pretrained()
        try:
            att = pub.commit(ops.state_dict(module))
        except Exception as e:
            if opts.weight_cache == "daemon":
                raise
            # The module's memory was the lease's: load it again, our own.
            del module
            t1 = time.monotonic()
            module = ops.from_pretrained()
            w.update(source="disk", miss_reason="publish failed: %s" % e, attach_ms=0.0, load_ms=_ms(t1))
            return module, ()
        w.update(source="published", attach_ms=0.0, load_ms=_ms(t0))
        return module, (pub, att)
    reason = pub.reason or "the holder neither has this layout nor gave a lease"
    t1 = time.monotonic()
    module = ops.from_pretrained()
    w.update(source="disk", miss_reason=reason, attach_ms=0.0, load_ms=_ms(t1))
    return module, ()


def _checkpoint_layout(opts, ops, client, w):
    t0 = time.monotonic()
    att = client.attach(opts.socket, opts.weight_cache, checkpoint_dir=opts.model, backend=ops.backend,
                        device=ops.device_index, revision=opts.revision, client_name=ENGINE_NAME)
    if att.from_holder:
        attached_ms = _ms(t0)
        t1 = time.monotonic()
        module = ops.build_on_meta()
        try:
            client.bind_module(module, ops.tensors(att))
        except Exception as e:
            if opts.weight_cache == "daemon" or not _is_bind_error(e):
                raise
            reason = "the checkpoint's tensors do not fit this model's modules (%s); use --layout engine" % (
                str(e).splitlines()[0])
            t2 = time.monotonic()
            module = ops.from_pretrained()
            w.update(source="disk", miss_reason=reason, attach_ms=0.0, load_ms=_ms(t2))
            return module, ()
        w.update(source="holder", attach_ms=attached_ms + _ms(t1), load_ms=0.0)
        return module, (att,)
    t1 = time.monotonic()
    module = ops.from_pretrained()
    w.update(source="disk", miss_reason=att.reason, attach_ms=0.0, load_ms=_ms(t1))
    if att.diffs:
        w["diffs"] = att.diffs
    return module, ()


def _is_bind_error(e):
    return type(e).__name__ == "BindError"


# ---------------------------------------------------------------- torch


def parse_device(text):
    """"cpu" -> ("cpu", None); "cuda:N" or "N" (as the supervisor's {devices}
    gives it) -> ("cuda:N", N). None for anything else."""
    if text == "cpu":
        return "cpu", None
    n = text[5:] if text.startswith("cuda:") else text
    if n.isdigit() and len(n) <= 4:
        return "cuda:%d" % int(n), int(n)
    return None


_DTYPES = {"float32": "float32", "float": "float32", "bfloat16": "bfloat16", "float16": "float16",
           "half": "float16"}


def config_dtype_name(model_dir):
    """The checkpoint's dtype from config.json ("dtype", or the older
    "torch_dtype"); float32 when it names none."""
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return "float32"
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    return _DTYPES.get(str(name), "float32")


def _eos_ids(model_dir):
    """End-of-sequence ids from config.json and generation_config.json (an
    integer or a list; absent or null: none)."""
    out = set()
    for name in ("config.json", "generation_config.json"):
        try:
            with open(os.path.join(model_dir, name)) as f:
                v = json.load(f).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(v, int) and not isinstance(v, bool):
            out.add(v)
        elif isinstance(v, list):
            out.update(x for x in v if isinstance(x, int) and not isinstance(x, bool))
    return out


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class HFTokenizer:
    name = "transformers"

    def __init__(self, model_dir):
        from transformers import AutoTokenizer
        self._tok = AutoTokenizer.from_pretrained(model_dir)

    def encode(self, text):
        # A completion's text is encoded with the tokenizer's special tokens
        # (a Llama-3 prompt starts with its BOS), as vLLM encodes it.
        return list(self._tok.encode(text, add_special_tokens=True))

    def decode(self, ids):
        # Output text without the special tokens, as vLLM's default; no
        # clean-up of spaces, so that a stream's pieces add up to it.
        return self._tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def render_chat(self, messages, add_generation_prompt, extra):
        """The chat's ids: its template's text, encoded without added tokens."""
        try:
            text = self._tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                 tokenize=False, **extra)
        except Exception as e:  # no template, or the template refused this chat
            raise api.ApiError("the chat template: %s" % e) from None
        return list(self._tok.encode(text, add_special_tokens=False))

    def incremental(self, context=()):
        return IncrementalDecoder(self.decode, context)


class TorchOps:
    """acquire()'s torch operations for one checkpoint, dtype and device."""

    def __init__(self, model_dir, dtype, device, device_index, backend):
        import torch
        import transformers
        from transformers import AutoConfig
        self.model_dir = model_dir
        self.dtype = dtype
        self.device = device
        self.device_index = 0 if device_index is None else device_index
        self.backend = backend
        self.config = AutoConfig.from_pretrained(model_dir)
        dtype_name = str(dtype).replace("torch.", "")
        # Part of the layout's fingerprint: another transformers release or
        # dtype computes from other tensors, so it gets its own layout.
        self.transform = "transformers-%s-%s" % (transformers.__version__, dtype_name)
        self._torch = torch

    def build_on_meta(self):
        from transformers import AutoModelForCausalLM
        with self._torch.device("meta"):
            return AutoModelForCausalLM.from_config(self.config, dtype=self.dtype)

    def from_pretrained(self):
        from transformers import AutoModelForCausalLM
        return AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=self.dtype, device_map=self.device)

    def state_dict(self, module):
        return module.state_dict()

    def tensors(self, att):
        return att.tensors("torch")

    def nbytes(self, module):
        seen, total = set(), 0
        for t in module.state_dict().values():
            key = (t.device.type, t.data_ptr())
            if key in seen:
                continue  # a tied weight counts once
            seen.add(key)
            total += t.numel() * t.element_size()
        return total


class TransformersModel:
    impl = "transformers"

    def __init__(self, opts, client_loader):
        t0 = time.monotonic()
        import torch
        parsed = parse_device(opts.device)
        if parsed is None:
            raise LoadError("--device %r is not one of cpu, cuda:N, N" % opts.device, 2)
        device, index = parsed
        if index is not None:
            if not torch.cuda.is_available():
                raise LoadError("--device %s: this torch sees no GPU (torch %s, CUDA %s)" %
                                (device, torch.__version__, torch.version.cuda))
            torch.cuda.set_device(index)
        # Float32 matmuls in float32, not TF32: the test goldens were made so,
        # and a known-answer probe must not depend on the GPU's defaults.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        dtype_name = config_dtype_name(opts.model) if opts.dtype == "auto" else opts.dtype
        self.dtype = getattr(torch, dtype_name)
        self._torch = torch
        self._device = torch.device(device)
        self.device = device
        ops = TorchOps(opts.model, self.dtype, device, index, opts.backend)
        cfg = ops.config.get_text_config() if hasattr(ops.config, "get_text_config") else ops.config
        self.vocab_size = int(cfg.vocab_size)
        self.context = int(getattr(cfg, "max_position_embeddings", 0) or 2048)
        self.eos_ids = _eos_ids(opts.model)
        self.name = opts.model_name or os.path.basename(os.path.normpath(opts.model))
        if any(os.path.exists(os.path.join(opts.model, f)) for f in TOKENIZER_FILES):
            self.tokenizer = HFTokenizer(opts.model)
        else:
            self.tokenizer = ByteTokenizer()
        self.phases = [("context", _ms(t0), "%s, %s, tokenizer %s" % (device, dtype_name, self.tokenizer.name))]

        t0 = time.monotonic()
        client = client_loader() if opts.weight_cache != "off" else None
        module, self.weights, self._keep = acquire(opts, ops, client)
        self._model = module.eval()
        self.phases.append(("weights", _ms(t0), "%s, mode %s, layout %s" % (
            self.weights["source"], opts.weight_cache, opts.layout)))

        import inspect
        try:
            params = inspect.signature(self._model.forward).parameters
        except (TypeError, ValueError):
            params = {}
        self._logits_kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._lock = threading.Lock()

        t0 = time.monotonic()
        for _ in self.generate([0], 2):  # the first forwards pay for kernel selection, not a request
            pass
        self.phases.append(("warmup", _ms(t0), "2 tokens"))

    def _forward(self, ids, past):
        torch = self._torch
        x = torch.tensor([ids], dtype=torch.long, device=self._device)
        with self._lock, torch.inference_mode():
            out = self._model(input_ids=x, past_key_values=past, use_cache=True, **self._logits_kw)
        return out.logits[0, -1], out.past_key_values

    def generate(self, prompt, max_tokens, temperature=0.0, seed=None):
        """Yields max_tokens token ids (the caller stops early at an end of
        sequence, or by closing the generator, which frees the KV cache)."""
        torch = self._torch
        gen = None
        if temperature > 0:
            gen = torch.Generator(device=self._device)
            gen.manual_seed((seed or 0) & ((1 << 63) - 1))
        logits, past = self._forward(list(prompt), None)
        for i in range(max_tokens):
            if gen is None:
                tok = int(torch.argmax(logits).item())
            else:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                tok = int(torch.multinomial(probs, 1, generator=gen).item())
            yield tok
            if i + 1 < max_tokens:
                logits, past = self._forward([tok], past)
