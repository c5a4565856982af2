"""The OpenAI-compatible completion API of the example engine: parsing and
validating a POST /v1/completions body, and rendering answers and stream
chunks, in the reference engine's words and shapes (engine/api.h), so that
the front's stream resume and the supervisor's semantic probe treat both
engines alike.

Validation is strict about what the engine would otherwise get wrong (types,
ranges, options that change results) and lenient about the rest (unknown
fields are ignored). Every refusal is an ApiError whose message names the
field, what was sent and what is allowed; the HTTP layer answers it with 400.

Defaults: max_tokens 16, temperature 0 (greedy), stream false.

What the front and the probe rely on:
- `choices[0].token_ids` when `return_token_ids` is true (the probe compares
  them with `probe.expect_token_ids`; the front asks for them on every
  stream so it can resume one that is cut);
- stream chunks as server-sent events `data: {json}` with one choice each
  and `finish_reason` null until the last, then `data: [DONE]`;
- a string prompt becomes token ids through the engine's tokenizer (with
  its special tokens, as vLLM encodes it), and with `return_token_ids` the
  prompt's ids are reported (`prompt_token_ids`): the front resumes a cut
  stream from them;
- POST /v1/chat/completions renders the messages with the checkpoint's
  chat template (transformers' apply_chat_template) and answers in
  chat.completion shapes, the prompt's ids at the top.

Pure functions; no torch; any thread.
"""

import json
import math

MAX_JSON_DEPTH = 64  # common/json_limits.h: the one nesting bound of every wsup parser
EXAMPLE = '{"prompt": "Hello", "max_tokens": 16}'


class ApiError(ValueError):
    """A request the engine refuses (400); the message says what to send."""


class CompletionRequest:
    __slots__ = ("prompt", "max_tokens", "temperature", "seed", "stream", "return_token_ids", "include_usage",
                 "model", "chat")

    def __init__(self):
        self.chat = False
        self.prompt = []
        self.max_tokens = 16
        self.temperature = 0.0
        self.seed = None
        self.stream = False
        self.return_token_ids = False
        self.include_usage = False
        self.model = ""


def json_nesting_depth(text, stop_at=MAX_JSON_DEPTH):
    """The deepest bracket nesting of `text` outside strings, or stop_at + 1
    once it passes stop_at (the scan ends there). A stray closing bracket
    never lowers the depth below zero, so it cannot hide deeper nesting."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > stop_at:
                    return stop_at + 1
        elif ch in "]}":
            if depth > 0:
                depth -= 1
    return deepest


def _type_name(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, float):
        return "a non-integer number"
    return "an integer"


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return (isinstance(v, (int, float))) and not isinstance(v, bool)


def _refuse_constant(name):
    # json.loads takes NaN and Infinity by default; JSON has neither.
    raise ValueError("not JSON: " + name)


def _get_int(j, key, lo, hi, default, hint):
    v = j.get(key)
    if v is None:
        return default
    if not _is_int(v):
        raise ApiError("'%s' must be an integer, got %s; %s" % (key, _type_name(v), hint))
    if v < lo or v > hi:
        raise ApiError("'%s' is %d; %s" % (key, v, hint))
    return v


def _get_bool(j, key, default):
    v = j.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError("'%s' must be true or false, got %s" % (key, _type_name(v)))
    return v


def _check_neutral(j):
    """Options that would change the answer in ways this engine does not
    implement are refused unless they carry their neutral value."""
    for key, neutral in (("n", 1), ("best_of", 1), ("top_p", 1), ("presence_penalty", 0),
                         ("frequency_penalty", 0)):
        v = j.get(key)
        if v is None:
            continue
        if not _is_number(v) or v != neutral:
            raise ApiError("'%s' is not supported by this engine; omit it or send %d" % (key, neutral))
    for key in ("stop", "suffix", "logprobs", "logit_bias"):
        v = j.get(key)
        if v is None:
            continue
        if isinstance(v, (list, dict, str)) and len(v) == 0:
            continue
        if v is False:
            continue
        raise ApiError("'%s' is not supported by this engine; omit it" % key)
    echo = j.get("echo")
    if echo is not None and echo is not False:
        raise ApiError("'echo' is not supported by this engine; omit it or send false")


def _load_body(body, example):
    """The body (bytes or str) as a JSON object, bounded before it is parsed."""
    if isinstance(body, (bytes, bytearray)):
        try:
            text = bytes(body).decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError("the request body is not valid JSON (not UTF-8)" + example) from None
    else:
        text = body
    # Deep input is refused before the parser recurses into it.
    if json_nesting_depth(text) > MAX_JSON_DEPTH:
        raise ApiError("the request body is JSON nested deeper than the limit of %d levels%s" %
                       (MAX_JSON_DEPTH, example))
    try:
        j = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        raise ApiError("the request body is not valid JSON" + example) from None
    if not isinstance(j, dict):
        raise ApiError("the request body is %s, not a JSON object%s" % (_type_name(j), example))
    return j


def parse_completion(body, vocab, context, encode):
    """A CompletionRequest from the body (bytes or str). vocab: token ids
    must be below it; context: positions a sequence may use (prompt +
    max_tokens); encode(text) -> ids for a string prompt (with the
    tokenizer's special tokens, as vLLM encodes it). Raises ApiError."""
    example = "; send a JSON object such as " + EXAMPLE
    j = _load_body(body, example)
    r = CompletionRequest()
    p = j.get("prompt")
    if p is None:
        raise ApiError("'prompt' is required: a string, or a list of token ids" + example)
    if isinstance(p, str):
        r.prompt = list(encode(p))
    elif isinstance(p, list):
        ids = []
        for v in p:
            if isinstance(v, (str, list)):
                raise ApiError("'prompt' holds a list of prompts; this engine takes one prompt per request: send a "
                               "string or one list of token ids")
            if not _is_int(v):
                raise ApiError("'prompt' as a list must hold token ids (integers), found " + _type_name(v))
            if v < 0 or v >= vocab:
                raise ApiError("'prompt' holds token id %d, outside the vocabulary [0, %d)" % (v, vocab))
            ids.append(v)
        r.prompt = ids
    else:
        raise ApiError("'prompt' must be a string or a list of token ids, got " + _type_name(p))
    _fit_length(j, r, context, "max_tokens")
    _options(j, r)
    return r


def _fit_length(j, r, context, key):
    """The prompt against the context, and j[key] against the room left."""
    if not r.prompt:
        raise ApiError("'prompt' is empty; send at least one character or token id")
    plen = len(r.prompt)
    if plen >= context:
        raise ApiError("the prompt has %d tokens; the model's context is %d tokens, leaving no room to generate: "
                       "shorten the prompt" % (plen, context))

    room = context - plen
    max_tokens = _get_int(j, key, 1, room, None,
                          "with a prompt of %d tokens and a context of %d, send 1 to %d" % (plen, context, room))
    if max_tokens is None:
        if 16 > room:  # the default alone may not fit a long prompt
            raise ApiError("the prompt has %d tokens and the default %s 16 would exceed the context of %d; "
                           "send %s of at most %d" % (plen, key, context, key, room))
        max_tokens = 16
    r.max_tokens = max_tokens


def _options(j, r):
    """What generation takes besides the prompt and its length."""
    t = j.get("temperature")
    if t is not None:
        if not _is_number(t):
            raise ApiError("'temperature' must be a number, got %s; send 0 to 2" % _type_name(t))
        if not (math.isfinite(t) and 0 <= t <= 2):
            raise ApiError("'temperature' is %s; send 0 (greedy) to 2" % json.dumps(t))
        r.temperature = float(t)
    s = j.get("seed")
    if s is not None:
        if not _is_int(s):
            raise ApiError("'seed' must be an integer, got " + _type_name(s))
        r.seed = s % (1 << 64)
    r.stream = _get_bool(j, "stream", False)
    r.return_token_ids = _get_bool(j, "return_token_ids", False)
    so = j.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise ApiError("'stream_options' must be an object, got " + _type_name(so))
        r.include_usage = _get_bool(so, "include_usage", False)
    m = j.get("model")
    if m is not None:
        if not isinstance(m, str):
            raise ApiError("'model' must be a string, got " + _type_name(m))
        r.model = m
    _check_neutral(j)


CHAT_EXAMPLE = '{"messages": [{"role": "user", "content": "Hello"}]}'


def parse_chat(body, context, render):
    """A CompletionRequest (chat=True) from a POST /v1/chat/completions body.
    render(messages, add_generation_prompt, extra) -> the prompt's ids: the
    chat template's text encoded without added special tokens; it raises
    ApiError when the model has no template or the template refuses. A
    content given as text parts is joined with newlines, as vLLM does."""
    example = "; send a JSON object such as " + CHAT_EXAMPLE
    j = _load_body(body, example)
    msgs = j.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError("'messages' is required: a non-empty list of {\"role\", \"content\"} objects" + example)
    norm = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError("'messages[%d]' needs a 'role' string%s" % (i, example))
        m = dict(m)
        c = m.get("content")
        if isinstance(c, list):
            texts = []
            for k, part in enumerate(c):
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise ApiError("'messages[%d].content'[%d] is not a text part ({\"type\": \"text\", \"text\": "
                                   "\"...\"}); this engine reads text only" % (i, k))
                texts.append(part["text"])
            m["content"] = "\n".join(texts)
        elif c is not None and not isinstance(c, str):
            raise ApiError("'messages[%d].content' must be a string, null or a list of text parts" % i)
        norm.append(m)
    add_generation_prompt = _get_bool(j, "add_generation_prompt", True)
    extra = {}
    if j.get("tools") is not None:
        if not isinstance(j["tools"], list):
            raise ApiError("'tools' must be a list of tool definitions")
        extra["tools"] = j["tools"]
    kw = j.get("chat_template_kwargs")
    if kw is not None:
        if not isinstance(kw, dict):
            raise ApiError("'chat_template_kwargs' must be an object of the template's variables")
        for k in ("messages", "add_generation_prompt"):
            if k in kw:
                raise ApiError("'chat_template_kwargs' may not set '%s': send it as the request's own field" % k)
        extra.update(kw)
    r = CompletionRequest()
    r.chat = True
    r.prompt = list(render(norm, add_generation_prompt, extra))
    _fit_length(j, r, context, "max_completion_tokens" if j.get("max_completion_tokens") is not None else "max_tokens")
    _options(j, r)
    return r


def dumps(obj):
    """Compact JSON, UTF-8 text as it is (as the reference engine writes it)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def error_json(message, kind):
    return dumps({"error": {"message": message, "type": kind}})


def _choice(text, tokens, finish_reason, token_ids, prompt_ids=None):
    c = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
    if prompt_ids is not None:
        c["prompt_token_ids"] = list(prompt_ids)
    if token_ids:
        c["token_ids"] = list(tokens)
    return c


def completion_json(cid, created, model, text, tokens, finish_reason, token_ids, prompt):
    """The whole (non-streamed) answer; with token_ids (return_token_ids)
    the choice carries the prompt's ids too, as vLLM's servers answer it."""
    n = len(tokens)
    return dumps({
        "id": cid, "object": "text_completion", "created": created, "model": model,
        "choices": [_choice(text, tokens, finish_reason, token_ids, prompt if token_ids else None)],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n},
    })


def stream_chunk_json(cid, created, model, text, tokens, finish_reason, token_ids, prompt_ids=None):
    """One stream chunk; finish_reason None until the last. prompt_ids: the
    prompt's ids, in the first chunk of a stream with return_token_ids (the
    front resumes a cut stream from them: docs/front.md)."""
    return dumps({
        "id": cid, "object": "text_completion", "created": created, "model": model,
        "choices": [_choice(text, tokens, finish_reason, token_ids, prompt_ids)],
    })


def chat_completion_json(cid, created, model, text, tokens, finish_reason, token_ids, prompt):
    """The whole chat answer; with token_ids, prompt_token_ids at the top
    (where vLLM puts a chat's) and token_ids in the choice."""
    n = len(tokens)
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
              "finish_reason": finish_reason}
    j = {"id": cid, "object": "chat.completion", "created": created, "model": model, "choices": [choice],
         "usage": {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}}
    if token_ids:
        choice["token_ids"] = list(tokens)
        j["prompt_token_ids"] = list(prompt)
    return dumps(j)


def chat_role_chunk_json(cid, created, model, prompt_ids=None):
    """A chat stream's first chunk: the role (and the prompt's ids)."""
    j = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}]}
    if prompt_ids is not None:
        j["prompt_token_ids"] = list(prompt_ids)
    return dumps(j)


def chat_chunk_json(cid, created, model, text, tokens, finish_reason, token_ids):
    choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason}
    if token_ids:
        choice["token_ids"] = list(tokens)
    return dumps({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                  "choices": [choice]})


def usage_chunk_json(cid, created, model, prompt_tokens, completion_tokens, chat=False):
    """The chunk sent before [DONE] when stream_options.include_usage."""
    return dumps({
        "id": cid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
        "model": model, "choices": [],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    })


def sse(data):
    """One server-sent event."""
    return ("data: " + data + "\n\n").encode("utf-8")
