"""The example engine (examples/transformers_engine) without torch: its
request parsing, its weight logic against stand-ins for the client and
torch, and the real server process on the fake model: completions streamed
and not, bad input, a busy engine, clients that go away, SIGTERM draining,
usage errors, and attaching a real holder's weights through the Python
client. The engine's life under the supervisor is test_example_engine_node.py.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from conftest import model_dir
from example_engine_util import (CONFIG, EXAMPLE_DIR, EventStream, complete, get_json, request, start_engine,
                                 stream_tokens, try_status, wait_for)

sys.path.insert(0, EXAMPLE_DIR)

import api  # noqa: E402
import fake_model  # noqa: E402
import model as model_mod  # noqa: E402
import tokens  # noqa: E402

MODEL = "llama-tiny-f32"


@pytest.fixture
def workdir(tmp_path):
    return str(tmp_path)


@pytest.fixture
def engine(workdir):
    """engine(*args, env=..., wait_ready=...): the fake-model engine on port 0;
    every engine started is SIGKILLed at the end."""
    started = []

    def start(*args, env=None, wait_ready=True, name=None):
        e = start_engine(["--model", model_dir(MODEL), "--model-impl", "fake"] + list(args), workdir,
                         name=name or "engine%d" % len(started), env=env, wait_ready=wait_ready)
        started.append(e)
        return e

    yield start
    for e in started:
        e.stop()


def greedy(prompt, n):
    ids = list(prompt.encode()) if isinstance(prompt, str) else prompt
    return fake_model.greedy(ids, n)


# ---------------------------------------------------------------- api.py


def parse(body, vocab=256, context=64):
    return api.parse_completion(body if isinstance(body, (bytes, str)) else json.dumps(body), vocab, context,
                                tokens.ByteTokenizer().encode)


def test_api_parses_good_requests_with_the_reference_engines_defaults():
    r = parse({"prompt": "Hi"})
    assert r.prompt == [72, 105] and r.max_tokens == 16 and r.temperature == 0 and not r.stream
    assert not r.return_token_ids and not r.include_usage and r.seed is None
    r = parse({"prompt": [1, 2, 255], "max_tokens": 61, "temperature": 0.5, "seed": -1, "stream": True,
               "return_token_ids": True, "stream_options": {"include_usage": True}, "model": "m", "n": 1,
               "top_p": 1, "stop": [], "echo": False, "unknown_field": {"x": 1}})
    assert r.prompt == [1, 2, 255] and r.max_tokens == 61 and r.temperature == 0.5 and r.stream
    assert r.return_token_ids and r.include_usage and r.model == "m" and r.seed == (1 << 64) - 1
    assert parse({"prompt": "é"}).prompt == [0xC3, 0xA9]  # UTF-8 bytes, as the front resumes a string prompt


@pytest.mark.parametrize("body,words", [
    (b"{", "not valid JSON"),
    (b"\xff\xfe", "not UTF-8"),
    ('{"prompt": NaN}', "not valid JSON"),
    ("[1, 2]", "is a list, not a JSON object"),
    ({}, "'prompt' is required"),
    ({"prompt": None}, "'prompt' is required"),
    ({"prompt": 5}, "'prompt' must be a string or a list of token ids, got an integer"),
    ({"prompt": ""}, "'prompt' is empty"),
    ({"prompt": []}, "'prompt' is empty"),
    ({"prompt": ["a", "b"]}, "a list of prompts"),
    ({"prompt": [[1], [2]]}, "a list of prompts"),
    ({"prompt": [1, True]}, "found a boolean"),
    ({"prompt": [1, 2.5]}, "found a non-integer number"),
    ({"prompt": [256]}, "token id 256, outside the vocabulary [0, 256)"),
    ({"prompt": [-1]}, "token id -1, outside"),
    ({"prompt": [1] * 64}, "leaving no room to generate"),
    ({"prompt": [1] * 60}, "the default max_tokens 16 would exceed the context of 64; send max_tokens of at most 4"),
    ({"prompt": "a", "max_tokens": 0}, "'max_tokens' is 0; with a prompt of 1 tokens and a context of 64, send 1 to 63"),
    ({"prompt": "a", "max_tokens": 64}, "'max_tokens' is 64"),
    ('{"prompt": "a", "max_tokens": 1e400}', "'max_tokens' must be an integer, got a non-integer number"),
    ({"prompt": "a", "max_tokens": "16"}, "'max_tokens' must be an integer, got a string"),
    ({"prompt": "a", "max_tokens": True}, "'max_tokens' must be an integer, got a boolean"),
    ({"prompt": "a", "max_tokens": 16.0}, "got a non-integer number"),
    ({"prompt": "a", "temperature": 2.5}, "'temperature' is 2.5; send 0 (greedy) to 2"),
    ({"prompt": "a", "temperature": -0.1}, "'temperature' is -0.1"),
    ({"prompt": "a", "temperature": "0"}, "'temperature' must be a number, got a string"),
    ({"prompt": "a", "seed": 1.5}, "'seed' must be an integer"),
    ({"prompt": "a", "stream": "yes"}, "'stream' must be true or false, got a string"),
    ({"prompt": "a", "return_token_ids": 1}, "'return_token_ids' must be true or false, got an integer"),
    ({"prompt": "a", "stream_options": []}, "'stream_options' must be an object"),
    ({"prompt": "a", "stream_options": {"include_usage": "x"}}, "'include_usage' must be true or false"),
    ({"prompt": "a", "model": 3}, "'model' must be a string"),
    ({"prompt": "a", "n": 2}, "'n' is not supported by this engine; omit it or send 1"),
    ({"prompt": "a", "best_of": 3}, "'best_of' is not supported"),
    ({"prompt": "a", "top_p": 0.9}, "'top_p' is not supported"),
    ({"prompt": "a", "presence_penalty": 1}, "'presence_penalty' is not supported by this engine; omit it or send 0"),
    ({"prompt": "a", "stop": ["x"]}, "'stop' is not supported by this engine; omit it"),
    ({"prompt": "a", "logprobs": 5}, "'logprobs' is not supported"),
    ({"prompt": "a", "logit_bias": {"1": 2}}, "'logit_bias' is not supported"),
    ({"prompt": "a", "echo": True}, "'echo' is not supported"),
    ("[" * 65 + "]" * 65, "nested deeper than the limit of 64 levels"),
    ('{"prompt": "' + "[" * 30 + '"}', None),  # brackets inside a string do not count
])
def test_api_refuses_bad_requests_naming_the_field_and_the_fix(body, words):
    if words is None:
        assert parse(body).prompt == [ord("[")] * 30
        return
    with pytest.raises(api.ApiError) as e:
        parse(body)
    assert words in str(e.value)


def test_api_nesting_scan_matches_the_shared_limit():
    assert api.json_nesting_depth("[]") == 1
    assert api.json_nesting_depth('{"a": [{"b": "]]]]"}]}') == 3
    assert api.json_nesting_depth("]]]][[") == 2  # a stray bracket never lowers the depth below zero
    assert api.json_nesting_depth("[" * 1000, stop_at=64) == 65
    assert api.json_nesting_depth('"\\"[[["') == 0  # an escaped quote keeps the string open


def test_api_parses_a_chat_and_renders_chat_shapes():
    seen = {}

    def render(messages, add_generation_prompt, extra):
        seen.update(messages=messages, agp=add_generation_prompt, extra=extra)
        return [7] * (len(messages) + 2)

    body = json.dumps({"messages": [{"role": "system", "content": "s"},
                                    {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                 {"type": "text", "text": "b"}]}],
                       "max_completion_tokens": 5, "stream": True, "chat_template_kwargs": {"enable_thinking": False},
                       "tools": [{"type": "function"}]})
    r = api.parse_chat(body, 64, render)
    assert r.chat and r.prompt == [7, 7, 7, 7] and r.max_tokens == 5 and r.stream
    assert seen["messages"][1]["content"] == "a\nb" and seen["agp"] is True
    assert seen["extra"] == {"enable_thinking": False, "tools": [{"type": "function"}]}
    for bad, says in [({"messages": []}, "'messages' is required"),
                      ({"messages": [{"content": "x"}]}, "needs a 'role'"),
                      ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "not a text part"),
                      ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 100}, "'max_tokens' is 100"),
                      ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"messages": 1}},
                       "may not set 'messages'")]:
        try:
            api.parse_chat(json.dumps(bad), 64, render)
            assert False, bad
        except api.ApiError as e:
            assert says in str(e), (bad, str(e))
    try:
        api.parse_chat(json.dumps({"messages": [{"role": "user", "content": "x"}]}), 64,
                       tokens.ByteTokenizer().render_chat)
        assert False
    except api.ApiError as e:
        assert "no chat template" in str(e)
    j = json.loads(api.chat_completion_json("chatcmpl-1", 7, "m", "ab", [97, 98], "length", True, [5, 6]))
    assert j["object"] == "chat.completion" and j["prompt_token_ids"] == [5, 6]
    assert j["choices"][0]["message"] == {"role": "assistant", "content": "ab"} and j["choices"][0]["token_ids"] == [97, 98]
    first = json.loads(api.chat_role_chunk_json("c", 1, "m", [5]))
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""} and first["prompt_token_ids"] == [5]
    c = json.loads(api.chat_chunk_json("c", 1, "m", "a", [97], None, False))
    assert c["object"] == "chat.completion.chunk" and c["choices"][0]["delta"] == {"content": "a"}
    assert "token_ids" not in c["choices"][0]
    assert json.loads(api.usage_chunk_json("c", 1, "m", 4, 2, True))["object"] == "chat.completion.chunk"


def test_api_renders_the_reference_engines_shapes():
    j = json.loads(api.completion_json("cmpl-1", 7, "m", "ab", [97, 98], "length", True, [5, 6, 7]))
    assert j["object"] == "text_completion" and j["id"] == "cmpl-1" and j["created"] == 7 and j["model"] == "m"
    assert j["choices"] == [{"text": "ab", "index": 0, "logprobs": None, "finish_reason": "length",
                             "prompt_token_ids": [5, 6, 7], "token_ids": [97, 98]}]
    assert j["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    plain = json.loads(api.completion_json("c", 1, "m", "", [], "stop", False, [1]))["choices"][0]
    assert "token_ids" not in plain and "prompt_token_ids" not in plain
    c = json.loads(api.stream_chunk_json("c", 1, "m", "a", [97], None, True, [5, 6]))
    assert c["choices"][0]["finish_reason"] is None and c["choices"][0]["token_ids"] == [97] and "usage" not in c
    assert c["choices"][0]["prompt_token_ids"] == [5, 6]
    assert "prompt_token_ids" not in json.loads(api.stream_chunk_json("c", 1, "m", "a", [97], None, True))["choices"][0]
    u = json.loads(api.usage_chunk_json("c", 1, "m", 4, 2))
    assert u["choices"] == [] and u["usage"]["total_tokens"] == 6
    assert api.sse("[DONE]") == b"data: [DONE]\n\n"
    assert json.loads(api.error_json("why", "invalid_request_error")) == {
        "error": {"message": "why", "type": "invalid_request_error"}}


def test_byte_tokenizer_and_incremental_decoding():
    t = tokens.ByteTokenizer()
    assert t.encode("Hi é") == [72, 105, 32, 0xC3, 0xA9]
    # The reference engine's rendering: id t is the character U+00tt.
    assert t.decode([72, 0xE8, 0xD800, 0x110000]) == "H\u00e8\ufffd\ufffd"
    d = t.incremental()
    assert d.push([72]) + d.push([0xE8]) + d.flush() == "H\u00e8"

    # A tokenizer whose tokens split characters: held back until complete.
    def decode(ids):
        return bytes(ids).decode("utf-8", errors="replace")

    d = tokens.IncrementalDecoder(decode)
    assert d.push([0x61]) == "a"
    assert d.push([0xC3]) == ""
    assert d.push([0xA9]) == "\u00e9"
    assert d.push([0xE2, 0x82]) == ""
    assert d.flush() == "\ufffd"


def test_a_continuation_reads_as_the_uninterrupted_stream_at_every_cut():
    # Byte-level pieces as GPT-2 style vocabularies have them: a space with
    # the first byte of a character, a lone continuation byte, the end of an
    # emoji with a letter.
    vocab = {1: b" \xe4", 2: b"\xb8", 3: b"\xad", 4: b"a", 5: b"\xf0\x9f", 6: b"\x98\x80b", 7: b"\xef\xbf\xbd"}

    def decode(ids):
        return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")

    prompt = [4, 1]
    gen = [2, 3, 4, 5, 6, 1, 2, 3, 7, 4, 5]
    whole = tokens.IncrementalDecoder(decode, prompt)
    pieces = [whole.push([t]) for t in gen]
    pieces[-1] += whole.flush()
    assert "".join(pieces) == "\u4e2da\U0001f600b \u4e2d\ufffda\ufffd"
    for cut in range(len(gen)):  # a stream cut after its last token has nothing to resume
        rest = tokens.IncrementalDecoder(decode, prompt + gen[:cut])
        tail = "".join(rest.push([t]) for t in gen[cut:]) + rest.flush()
        assert "".join(pieces[:cut]) + tail == "".join(pieces), cut


# ---------------------------------------------------------------- model.py's weight logic


class Opts:
    def __init__(self, mode="client", layout="engine"):
        self.weight_cache = mode
        self.layout = layout
        self.socket = "/run/holder.sock"
        self.model = "/models/m"
        self.revision = "r1"


class FakeOps:
    """model.acquire()'s torch operations, recorded."""

    transform = "transformers-5.17.0-float32"
    backend = "cuda"
    device_index = 3

    def __init__(self, events):
        self.events = events

    def build_on_meta(self):
        self.events.append("meta")
        return {"module": "meta"}

    def from_pretrained(self):
        self.events.append("from_pretrained")
        return {"module": "disk"}

    def state_dict(self, module):
        return {"w": module}

    def tensors(self, att):
        return att.tensors_

    def nbytes(self, module):
        return 1234


class FakeAttachment:
    def __init__(self, from_holder=True, reason="", diffs=()):
        self.from_holder = from_holder
        self.reason = reason
        self.diffs = list(diffs)
        self.tensors_ = {"w": "holder-tensor"}


class FakePublication:
    def __init__(self, events, attached=False, lease=False, reason="", commit_error=None):
        self.events = events
        self.attached = attached
        self.has_lease = lease
        self.reason = reason
        self.attachment = FakeAttachment() if attached else None
        self.commit_error = commit_error
        self.in_pool = False

    @contextlib.contextmanager
    def torch_pool(self):
        self.events.append("pool:enter")
        self.in_pool = True
        try:
            yield
        finally:
            self.in_pool = False
            self.events.append("pool:exit")

    def commit(self, state_dict):
        self.events.append(("commit", state_dict))
        if self.commit_error:
            raise self.commit_error
        self.committed = FakeAttachment()
        return self.committed


class BindError(Exception):  # the name acquire() recognizes, as wsup_client.torch_bind.BindError
    pass


class FakeClient:
    def __init__(self, events, publication=None, attachment=None, bind_error=None):
        self.events = events
        self.publication = publication
        self.attachment = attachment
        self.bind_error = bind_error
        self.calls = []

    def publish(self, socket_path, mode, **kw):
        self.calls.append(("publish", socket_path, mode, kw))
        if isinstance(self.publication, Exception):
            raise self.publication
        return self.publication

    def attach(self, socket_path, mode, **kw):
        self.calls.append(("attach", socket_path, mode, kw))
        if isinstance(self.attachment, Exception):
            raise self.attachment
        return self.attachment

    def bind_module(self, module, tensors):
        self.events.append(("bind", module["module"], tensors))
        if self.bind_error:
            raise self.bind_error


def test_weights_engine_layout_attached_binds_the_layout_on_the_meta_device():
    ev = []
    pub = FakePublication(ev, attached=True)
    client = FakeClient(ev, publication=pub)
    module, w, keep = model_mod.acquire(Opts(), FakeOps(ev), client)
    assert w["source"] == "holder" and w["mode"] == "client" and w["layout"] == "engine"
    assert "miss_reason" not in w and w["load_ms"] == 0 and w["ms"] == w["attach_ms"] and w["bytes"] == 1234
    assert ev == ["meta", ("bind", "meta", {"w": "holder-tensor"})]
    assert module == {"module": "meta"}
    assert keep == (pub, pub.attachment)  # kept as long as the model
    (call,) = client.calls
    assert call[:3] == ("publish", "/run/holder.sock", "client")
    assert call[3] == {"checkpoint_dir": "/models/m", "backend": "cuda", "device": 3, "revision": "r1",
                       "engine": {"name": "wsup-transformers-example", "version": model_mod.VERSION,
                                  "transform": "transformers-5.17.0-float32"}}
    # Without a revision label the call is publish()'s plain form.
    opts = Opts()
    opts.revision = ""
    client = FakeClient([], publication=FakePublication([], attached=True))
    model_mod.acquire(opts, FakeOps([]), client)
    assert "revision" not in client.calls[0][3]


def test_weights_engine_layout_with_a_lease_loads_into_the_pool_and_commits_the_state_dict():
    ev = []
    pub = FakePublication(ev, lease=True)
    module, w, keep = model_mod.acquire(Opts(mode="daemon"), FakeOps(ev), FakeClient(ev, publication=pub))
    assert w["source"] == "published" and w["attach_ms"] == 0 and w["load_ms"] >= 0
    # from_pretrained ran inside the pool, the commit after it with the loaded model's state_dict.
    assert ev == ["pool:enter", "from_pretrained", "pool:exit", ("commit", {"w": {"module": "disk"}})]
    assert keep == (pub, pub.committed)


def test_weights_engine_layout_without_lease_or_layout_loads_from_disk_with_the_reason():
    ev = []
    pub = FakePublication(ev, reason="holder is busy: another writer")
    module, w, keep = model_mod.acquire(Opts(), FakeOps(ev), FakeClient(ev, publication=pub))
    assert w["source"] == "disk" and w["miss_reason"] == "holder is busy: another writer" and keep == ()
    assert ev == ["from_pretrained"]


def test_weights_engine_layout_failed_commit_client_reloads_daemon_raises():
    ev = []
    pub = FakePublication(ev, lease=True, commit_error=RuntimeError("commit refused: overlap"))
    module, w, keep = model_mod.acquire(Opts(), FakeOps(ev), FakeClient(ev, publication=pub))
    assert w["source"] == "disk" and "publish failed: commit refused: overlap" in w["miss_reason"]
    assert ev[-1] == "from_pretrained" and ev.count("from_pretrained") == 2 and keep == ()
    ev = []
    pub = FakePublication(ev, lease=True, commit_error=RuntimeError("commit refused"))
    with pytest.raises(RuntimeError, match="commit refused"):
        model_mod.acquire(Opts(mode="daemon"), FakeOps(ev), FakeClient(ev, publication=pub))


def test_weights_checkpoint_layout_hit_miss_and_bind_errors():
    ev = []
    att = FakeAttachment()
    client = FakeClient(ev, attachment=att)
    module, w, keep = model_mod.acquire(Opts(layout="checkpoint"), FakeOps(ev), client)
    assert w["source"] == "holder" and keep == (att,) and ev == ["meta", ("bind", "meta", {"w": "holder-tensor"})]
    assert client.calls[0][3]["revision"] == "r1" and client.calls[0][3]["device"] == 3

    ev = []
    miss = FakeAttachment(from_holder=False, reason="fingerprint mismatch: revision",
                          diffs=[{"field": "revision", "ours": "r1", "holder": "r0"}])
    module, w, keep = model_mod.acquire(Opts(layout="checkpoint"), FakeOps(ev), FakeClient(ev, attachment=miss))
    assert w["source"] == "disk" and w["miss_reason"] == "fingerprint mismatch: revision"
    assert w["diffs"] == [{"field": "revision", "ours": "r1", "holder": "r0"}] and ev == ["from_pretrained"]

    # MoE modules do not match their checkpoint's tensors: client mode loads from disk and says what to do ...
    ev = []
    client = FakeClient(ev, attachment=FakeAttachment(), bind_error=BindError("3 missing: mlp.experts.gate_up_proj"))
    module, w, keep = model_mod.acquire(Opts(layout="checkpoint"), FakeOps(ev), client)
    assert w["source"] == "disk" and "use --layout engine" in w["miss_reason"]
    assert "mlp.experts.gate_up_proj" in w["miss_reason"] and keep == ()
    # ... daemon mode refuses.
    ev = []
    client = FakeClient(ev, attachment=FakeAttachment(), bind_error=BindError("missing"))
    with pytest.raises(BindError):
        model_mod.acquire(Opts(mode="daemon", layout="checkpoint"), FakeOps(ev), client)


def test_weights_engine_layout_needs_a_client_with_publish():
    class OldClient:
        def attach(self, *a, **kw):
            raise AssertionError("not asked")
    with pytest.raises(model_mod.LoadError, match="has no publish") as e:
        model_mod.acquire(Opts(), FakeOps([]), OldClient())
    assert e.value.exit_code == 78  # restarting with the same client cannot help


def test_weights_mode_off_never_asks_a_holder():
    ev = []
    module, w, keep = model_mod.acquire(Opts(mode="off", layout="checkpoint"), FakeOps(ev), None)
    assert w["source"] == "disk" and w["miss_reason"] == "mode off" and ev == ["from_pretrained"]


def test_model_helpers_without_torch(tmp_path):
    assert model_mod.parse_device("cpu") == ("cpu", None)
    assert model_mod.parse_device("cuda:1") == ("cuda:1", 1)
    assert model_mod.parse_device("0") == ("cuda:0", 0)
    assert model_mod.parse_device("gpu0") is None and model_mod.parse_device("cuda:") is None
    assert model_mod.config_dtype_name(model_dir("qwen3moe-tiny-f32")) == "float32"
    assert model_mod.config_dtype_name(model_dir("llama-tiny-bf16-sharded")) == "bfloat16"
    assert model_mod.config_dtype_name(str(tmp_path)) == "float32"  # no config.json


# ---------------------------------------------------------------- the process


def test_starts_announces_ready_and_reports_status(engine):
    e = engine(env=dict(os.environ, WSUP_ENGINE_NONCE="n0nce"))
    assert "listening on 127.0.0.1:%d" % e.port in e.output()
    s = get_json(e.port, "/wsup/status")
    assert s["state"] == "ready" and s["nonce"] == "n0nce" and s["tp"] == 1
    assert s["engine"]["name"] == "wsup-transformers-example" and s["engine"]["impl"] == "fake"
    assert s["weights"] == {"mode": "off", "layout": "checkpoint", "source": "disk", "miss_reason": "mode off",
                            "attach_ms": 0.0, "load_ms": 0.0, "ms": 0.0}
    assert "weights" in s["phases"] and s["comm"]["warm"] is True
    assert s["requests"]["active"] == 0 and s["limits"]["vocab"] == 256
    assert get_json(e.port, "/health") == {"status": "ok", "state": "ready"}
    m = get_json(e.port, "/v1/models")
    assert m["data"][0]["id"] == MODEL and m["data"][0]["max_model_len"] == 2048


def test_with_a_control_token_status_answers_only_the_supervisor(engine):
    token = "0123456789abcdef0123456789abcdef"
    e = engine(env=dict(os.environ, WSUP_ENGINE_NONCE="n0nce", WSUP_CONTROL_TOKEN=token))
    for headers in (None, {"Authorization": "Bearer " + token[:-1] + "0"}, {"Authorization": "Basic " + token},
                    {"Authorization": token}):
        status, h, body = request(e.port, "GET", "/wsup/status", headers=headers)
        assert status == 401, (headers, status, body)
        assert h.get("www-authenticate") == "Bearer"
        assert b"n0nce" not in body and token.encode() not in body
        assert b"WSUP_CONTROL_TOKEN" in body
    # A wrong method or route under /wsup tells nothing either.
    assert request(e.port, "POST", "/wsup/status", b"")[0] == 401
    assert request(e.port, "GET", "/wsup/role")[0] == 401
    assert get_json(e.port, "/wsup/status", token=token)["nonce"] == "n0nce"
    assert get_json(e.port, "/health")["status"] == "ok"
    with open("/proc/%d/cmdline" % e.proc.pid, "rb") as f:
        assert token.encode() not in f.read()


def test_while_loading_status_says_starting_and_completions_get_503(engine):
    e = engine("--fake-load-ms", "60000", wait_ready=False)
    s = get_json(e.port, "/wsup/status")
    assert s["state"] == "starting" and "source" not in s["weights"]
    assert get_json(e.port, "/health")["state"] == "starting"
    status, headers, body = request(e.port, "POST", "/v1/completions", {"prompt": "a"})
    assert status == 503 and headers.get("retry-after") == "1"
    assert "loading the model" in json.loads(body)["error"]["message"]


def test_completions_are_the_models_greedy_answer(engine):
    e = engine()
    status, j = complete(e.port, "Hello, world")
    assert status == 200, j
    c = j["choices"][0]
    assert c["token_ids"] == greedy("Hello, world", 16) and c["finish_reason"] == "length"
    assert c["text"] == "".join(chr(t) for t in c["token_ids"])
    assert j["usage"] == {"prompt_tokens": 12, "completion_tokens": 16, "total_tokens": 28}
    assert j["id"].startswith("cmpl-") and j["object"] == "text_completion" and j["model"] == MODEL
    # Token ids as the prompt give the same answer; without return_token_ids there are none.
    status, j2 = complete(e.port, list(b"Hello, world"), max_tokens=5, return_token_ids=False)
    assert status == 200 and "token_ids" not in j2["choices"][0]
    assert j2["choices"][0]["text"] == c["text"][:5]
    # The answer after prompt + k tokens is the rest of it: what the front's resume relies on.
    status, j3 = complete(e.port, list(b"Hello, world") + c["token_ids"][:6], max_tokens=10)
    assert j3["choices"][0]["token_ids"] == c["token_ids"][6:]
    # X-Request-Id names the completion.
    status, _, body = request(e.port, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 1},
                              headers={"X-Request-Id": "abc-123"})
    assert json.loads(body)["id"] == "cmpl-abc-123"


def test_sampling_is_reproducible_with_a_seed(engine):
    e = engine()
    a = complete(e.port, "x", max_tokens=12, temperature=1.0, seed=7)[1]["choices"][0]["token_ids"]
    b = complete(e.port, "x", max_tokens=12, temperature=1.0, seed=7)[1]["choices"][0]["token_ids"]
    c = complete(e.port, "x", max_tokens=12, temperature=1.0, seed=8)[1]["choices"][0]["token_ids"]
    assert a == b and a != c and a != greedy("x", 12)


def test_streams_are_server_sent_events_ending_with_done(engine):
    e = engine()
    s = EventStream(e.port, {"prompt": "Hello, world", "max_tokens": 16, "stream": True, "return_token_ids": True,
                             "stream_options": {"include_usage": True}})
    try:
        assert s.status == 200 and s.headers["content-type"] == "text/event-stream"
        assert s.headers["transfer-encoding"] == "chunked"
        events = list(s.events())
    finally:
        s.close()
    assert s.ended_clean and events[-1] == "[DONE]"
    ids, finish, done = stream_tokens(events)
    assert ids == greedy("Hello, world", 16) and finish == "length" and done
    chunks = [x for x in events[:-1] if x["choices"]]
    assert len(chunks) == 16  # one token per event, the finish_reason on the last one's
    assert all(x["choices"][0]["finish_reason"] is None for x in chunks[:-1])
    assert len({x["id"] for x in events[:-1]}) == 1
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 16
    assert "".join(x["choices"][0]["text"] for x in chunks) == "".join(chr(t) for t in ids)


def test_an_end_of_sequence_token_stops_with_finish_reason_stop(engine):
    want = greedy("Hello, world", 16)
    eos = want[4]
    assert eos not in want[:4]
    e = engine("--fake-eos", str(eos))
    status, j = complete(e.port, "Hello, world")
    assert j["choices"][0]["token_ids"] == want[:5] and j["choices"][0]["finish_reason"] == "stop"
    s = EventStream(e.port, {"prompt": "Hello, world", "stream": True, "return_token_ids": True})
    try:
        ids, finish, done = stream_tokens(list(s.events()))
    finally:
        s.close()
    assert ids == want[:5] and finish == "stop" and done


def test_bad_requests_get_clear_errors_and_the_engine_keeps_serving(engine):
    e = engine("--max-body-bytes", "4096")
    cases = [
        ("POST", "/v1/completions", b"{nope", 400, "not valid JSON"),
        ("POST", "/v1/completions", b'{"prompt": [1, "x"]}', 400, "a list of prompts"),
        ("POST", "/v1/completions", b'{"prompt": "a", "max_tokens": 5000}', 400, "send 1 to 2047"),
        ("POST", "/v1/completions", b'{"prompt": "a", "max_tokens": "3"}', 400, "must be an integer, got a string"),
        ("POST", "/v1/completions", b'{"prompt": [999]}', 400, "outside the vocabulary [0, 256)"),
        ("POST", "/v1/completions", b'{"prompt": "a", "n": 2}', 400, "'n' is not supported"),
        ("POST", "/v1/completions", ("[" * 100 + "]" * 100).encode(), 400, "nested deeper than the limit of 64"),
        ("GET", "/v1/completions", None, 405, "method GET is not allowed on /v1/completions; use POST"),
        ("POST", "/wsup/status", b"", 405, "use GET"),
        ("GET", "/nope", None, 404, "no route /nope"),
        # The test model has no tokenizer of its own, so no chat template.
        ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}]}', 400,
         "no chat template"),
        ("POST", "/v1/chat/completions", b'{"messages": "hi"}', 400, "'messages' is required"),
    ]
    for method, path, body, want_status, words in cases:
        status, headers, data = request(e.port, method, path, body)
        assert status == want_status, (path, body, data)
        err = json.loads(data)["error"]
        assert words in err["message"], (words, err)
        if want_status == 405:
            assert headers["allow"] in ("POST", "GET")
    # Too large: 413 before the body is read, and the connection closes.
    status, headers, data = request(e.port, "POST", "/v1/completions", b'{"prompt": "' + b"a" * 5000 + b'"}')
    assert status == 413 and "exceeds the limit of 4096 bytes" in json.loads(data)["error"]["message"]
    assert headers.get("connection") == "close"
    # A chunked body: 411.
    with socket.create_connection(("127.0.0.1", e.port), timeout=10) as c:
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
        head = c.recv(4096)
    assert head.startswith(b"HTTP/1.1 411")
    # A bad request line gets the same JSON shape.
    with socket.create_connection(("127.0.0.1", e.port), timeout=10) as c:
        c.sendall(b"BAD\r\n\r\n")
        reply = b""
        while True:  # it closes the connection after the answer
            chunk = c.recv(4096)
            if not chunk:
                break
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400") and b'"invalid_request_error"' in reply
    # Keep-alive survives the refusals that keep the connection, and answers stay right.
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", e.port, timeout=10)
    try:
        for body in (b'{"prompt": 7}', b'{"prompt": "a", "max_tokens": 3, "return_token_ids": true}'):
            conn.request("POST", "/v1/completions", body=body)
            r = conn.getresponse()
            data = json.loads(r.read())
        assert r.status == 200 and data["choices"][0]["token_ids"] == greedy("a", 3)
    finally:
        conn.close()
    s = get_json(e.port, "/wsup/status")
    assert s["requests"]["bad_requests"] >= 8 and s["state"] == "ready"


def _long_request(port, body, stream=False):
    """A raw connection that sent a completion request and reads nothing yet."""
    c = socket.create_connection(("127.0.0.1", port), timeout=30)
    data = json.dumps(dict(body, stream=stream)).encode()
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              b"%d\r\n\r\n%s" % (len(data), data))
    return c


def _requests(port):
    s = try_status(port)
    return s["requests"] if s else {}


def test_a_client_that_goes_away_stops_its_generation(engine):
    e = engine("--fake-token-delay-ms", "5")
    long = {"prompt": "a", "max_tokens": 2000, "return_token_ids": True}  # 10 s of tokens
    for how in ("close", "half-close", "stream-close"):
        before = _requests(e.port)
        c = _long_request(e.port, long, stream=(how == "stream-close"))
        if how == "stream-close":
            c.recv(1024)  # the stream's head and a first event
        assert wait_for(lambda: _requests(e.port).get("active") == 1, 10), how
        if how == "half-close":
            c.shutdown(socket.SHUT_WR)  # EOF with the request in flight: the client left
        else:
            c.close()
        assert wait_for(lambda: _requests(e.port).get("cancelled") == before["cancelled"] + 1, 5), (
            how, _requests(e.port))
        after = _requests(e.port)
        assert after["active"] == 0 and after["finished"] == before["finished"], how
        # Far fewer than the 2000 tokens asked for were made.
        assert after["generated_tokens"] - before["generated_tokens"] < 1500, how
        c.close()
    status, j = complete(e.port, "b", max_tokens=3)
    assert j["choices"][0]["token_ids"] == greedy("b", 3)


def test_a_busy_engine_answers_503_and_a_waiting_request_gets_its_turn(engine):
    e = engine("--fake-token-delay-ms", "5", "--max-active", "1", "--max-waiting", "1")
    first = _long_request(e.port, {"prompt": "a", "max_tokens": 2000})
    try:
        assert wait_for(lambda: _requests(e.port).get("active") == 1, 10)
        waiter = _long_request(e.port, {"prompt": "b", "max_tokens": 2, "return_token_ids": True})
        assert wait_for(lambda: _requests(e.port).get("waiting") == 1, 10)
        status, headers, body = request(e.port, "POST", "/v1/completions", {"prompt": "c"})
        assert status == 503 and headers.get("retry-after") == "1"
        assert "1 requests are waiting already (--max-waiting)" in json.loads(body)["error"]["message"]
        first.close()  # its turn passes to the waiter
        waiter.settimeout(20)
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = waiter.recv(65536)
            if not chunk:
                break
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200")
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["choices"][0]["token_ids"] == greedy("b", 2)
        waiter.close()
        assert _requests(e.port)["rejected_busy"] == 1
    finally:
        first.close()


def test_sigterm_refuses_new_connections_finishes_streams_in_flight_and_exits_0(engine):
    e = engine("--fake-token-delay-ms", "20", "--drain-timeout-ms", "30000")
    s = EventStream(e.port, {"prompt": "Hello, world", "max_tokens": 60, "stream": True, "return_token_ids": True})
    try:
        it = s.events()
        first = next(it)
        assert first["choices"][0]["token_ids"]
        e.signal(signal.SIGTERM)
        # The listening socket closes: new connections are refused, not queued.
        from example_engine_util import free_port_refused
        assert wait_for(lambda: free_port_refused(e.port), 10), e.output()
        events = [first] + list(it)
    finally:
        s.close()
    ids, finish, done = stream_tokens(events)
    assert ids == greedy("Hello, world", 60) and finish == "length" and done and s.ended_clean
    assert e.wait(30) == 0
    assert "stopped: 1 finished, 0 cut" in e.output()


def test_sigterm_cuts_what_outlasts_the_drain_bound_and_still_exits_0(engine):
    e = engine("--fake-token-delay-ms", "10", "--drain-timeout-ms", "100")
    s = EventStream(e.port, {"prompt": "a", "max_tokens": 2000, "stream": True, "return_token_ids": True})
    try:
        it = s.events()
        next(it)
        e.signal(signal.SIGTERM)
        rest = list(it)
    finally:
        s.close()
    ids, finish, done = stream_tokens(rest)
    # Cut without a finish_reason or [DONE]: the front resumes such a stream on the other engine.
    assert not done and finish is None and len(ids) < 1999
    assert e.wait(30) == 0
    out = e.output()
    assert "still running after --drain-timeout-ms 100: cutting them" in out and "0 finished, 1 cut" in out


def test_sigterm_while_loading_exits_0(engine):
    e = engine("--fake-load-ms", "60000", wait_ready=False)
    e.signal(signal.SIGTERM)
    assert e.wait(30) == 0


@pytest.mark.parametrize("args,words", [
    (["--weight-cache", "client"], "--weight-cache client needs --socket PATH"),
    (["--layout", "engine"], "--layout engine publishes to or attaches from a holder"),
    (["--weight-cache", "client", "--socket", "s", "--layout", "engine"], "makes no engine-made layouts"),
    (["--device", "gpu0"], "--device 'gpu0' is not one of cpu, cuda:N, N"),
    (["--backend", "cuda"], "--backend cuda keeps weights in GPU memory"),
    (["--port", "70000"], "--port 70000 is out of range"),
    (["--max-active", "0"], "--max-active 0 is out of range"),
    (["--weight-cache", "sometimes"], "invalid choice"),
])
def test_usage_errors_exit_2_naming_the_flag(args, words, workdir):
    r = subprocess.run([sys.executable, os.path.join(EXAMPLE_DIR, "server.py"), "--model", model_dir(MODEL),
                        "--model-impl", "fake"] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    assert r.returncode == 2, r.stdout
    assert words in r.stdout.decode()


def test_the_real_model_is_not_imported_without_transformers(workdir):
    # The default implementation needs torch; here (no torch) the start fails with the reason and exit 1.
    import importlib.util
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here: the GPU check covers the real model")
    r = subprocess.run([sys.executable, os.path.join(EXAMPLE_DIR, "server.py"), "--model", model_dir(MODEL),
                        "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    assert r.returncode == 1 and b"startup failed: No module named 'torch'" in r.stdout


# ---------------------------------------------------------------- weights through the Python client


def test_fake_model_attaches_a_real_holder_and_reports_the_source(engine, holder):
    h = holder(MODEL)
    e = engine("--weight-cache", "client", "--socket", h.socket)
    w = get_json(e.port, "/wsup/status")["weights"]
    assert w["source"] == "holder" and w["mode"] == "client" and w["tensors"] > 0 and w["bytes"] > 0
    assert "miss_reason" not in w
    # Another checkpoint than the holder's: client mode loads "from disk" and says why.
    e2 = engine("--weight-cache", "client", "--socket", h.socket, "--revision", "other")
    w2 = get_json(e2.port, "/wsup/status")["weights"]
    assert w2["source"] == "disk" and w2["miss_reason"]
    assert any(d["field"] == "revision" for d in w2.get("diffs", [])), w2


def test_daemon_mode_exit_codes_no_holder_1_mismatch_78(workdir, holder):
    server = os.path.join(EXAMPLE_DIR, "server.py")
    base = [sys.executable, server, "--model", model_dir(MODEL), "--model-impl", "fake", "--weight-cache", "daemon"]
    r = subprocess.run(base + ["--socket", os.path.join(workdir, "nobody.sock")], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    assert r.returncode == 1, r.stdout  # a holder may yet come: the supervisor retries
    assert b"startup failed" in r.stdout
    h = holder(MODEL)
    r = subprocess.run(base + ["--socket", h.socket, "--revision", "other"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    assert r.returncode == 78, r.stdout  # restarting unchanged cannot help
    assert b"revision" in r.stdout


# ---------------------------------------------------------------- the example config


def _bin(name):
    from conftest import bin_dir
    p = os.path.join(bin_dir(), name)
    if not os.access(p, os.X_OK):
        pytest.fail("%s is missing: build it (cmake --build build --target %s) or set WSUP_BIN_DIR" % (p, name))
    return p


def test_the_example_config_passes_wsup_check(workdir):
    wsup = _bin("wsup")
    with open(CONFIG) as f:
        text = f.read()
    # The probe expects the checkpoint's golden answer.
    from conftest import golden
    case = golden("qwen3moe-tiny-f32")["cases"][0]
    assert 'prompt = "%s"' % case["prompt"] in text
    assert "expect_token_ids = %s" % json.dumps(case["output_ids"]) in text

    def check(*extra):
        r = subprocess.run([wsup, "check", CONFIG] + list(extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=60)
        return r.returncode, r.stdout.decode(errors="replace")

    # On this machine's paths, with the host backend (no GPU here).
    host = ["--set", "weight_cache.backend=\"host\"", "--set", "parallel.devices=[]",
            "--set", "model.path=" + model_dir("qwen3moe-tiny-f32"),
            "--set", "node.state_dir=" + os.path.join(workdir, "state"),
            "--set", "node.runtime_dir=" + os.path.join(workdir, "run")]
    rc, out = check(*host)
    assert rc == 0, out
    # Every key is checked: a bad one fails.
    rc, out = check(*(host + ["--set", "probe.failures=0"]))
    assert rc == 1 and "probe.failures" in out
    # As written, for the GPU machine.
    rc, out = check("--no-paths")
    if rc != 0 and "host memory only in this version" in out:
        pytest.skip("weight_cache.layout = \"engine\" on the cuda backend is refused by this wsup: %s" % out.strip())
    assert rc == 0, out
