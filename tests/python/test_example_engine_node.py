"""The example engine as a third-party engine under the real supervisor:
`wsup start` on the example's own config (examples/transformers_engine/
wsup.toml), moved to the CPU and the fake model, with the real holder and
front. Both engines attach the holder's checkpoint through the Python client
and pass the semantic probe; a stream survives a SIGKILL of the active engine
(the front resumes it on the standby token for token); planned and crash
drills keep the answers right; `wsup stop` drains the engines (SIGTERM) and
leaves nothing running."""

import json
import os
import re
import signal
import sys

import pytest

from conftest import bin_dir, model_dir
from example_engine_util import CONFIG, EXAMPLE_DIR, SERVER, EventStream, Node, complete, stream_tokens, try_status, \
    wait_for

sys.path.insert(0, EXAMPLE_DIR)

import fake_model  # noqa: E402

PROMPT = "Hello, world"


def greedy(prompt, n):
    return fake_model.greedy(list(prompt.encode()) if isinstance(prompt, str) else prompt, n)


@pytest.fixture
def node(tmp_path):
    for name in ("wsup", "wsup-holder", "wsup-front"):
        p = os.path.join(bin_dir(), name)
        if not os.access(p, os.X_OK):
            pytest.fail("%s is missing: build it (cmake --build build --target %s) or set WSUP_BIN_DIR" % (p, name))
    engine = [sys.executable, SERVER, "--model-impl", "fake", "--fake-token-delay-ms", "5",
              "--model", "{model}", "--port", "{port}", "--weight-cache", "{mode}", "--socket", "{socket}",
              "--layout", "{layout}", "--backend", "{backend}", "--device", "{devices}", "--revision", "{revision}",
              "--ready-fd", "{ready_fd}", "--drain-timeout-ms", "5000"]
    sets = [
        # The CPU and the host backend; the holder loads the checkpoint the
        # fake model attaches (it makes no engine-made layouts).
        'weight_cache.backend="host"', "parallel.devices=[]", 'weight_cache.layout="checkpoint"',
        "model.path=" + model_dir("llama-tiny-f32"),
        "engine.command=" + json.dumps(engine),
        "engine.primary_port=0", "engine.standby_port=0", "front.listen=127.0.0.1:0", "admin.listen=127.0.0.1:0",
        "engine.ready_timeout_ms=60000",
        "probe.expect_token_ids=" + json.dumps(greedy(PROMPT, 16)),
        # Generous for a loaded CI machine: a late probe on a healthy engine
        # would make a drill refuse ("try again once its next probe passes").
        "probe.interval_ms=1000", "probe.timeout_ms=1000", "probe.jitter_ms=0", "probe.failures=3",
        "supervisor.restart_backoff_ms=100",
    ]
    n = Node(bin_dir(), CONFIG, sets, str(tmp_path))
    try:
        yield n
    finally:
        n.cleanup()


def engine_statuses(node, s):
    """Each engine's /wsup/status, asked with the control token the supervisor gave it."""
    return {e["slot"]: try_status(e["port"], node.engine_token(e["slot"])) for e in s["engines"] if e.get("port")}


def test_primary_and_standby_under_wsup_serve_fail_over_and_drain(node):
    rc, out = node.check()
    assert rc == 0, out
    node.start()
    assert node.wait_serving(60), node.log()
    s = node.status()
    front = node.front_port(s)
    status, j = complete(front, PROMPT)
    assert status == 200 and j["choices"][0]["token_ids"] == greedy(PROMPT, 16), j

    # Each engine: ready, known by its nonce, its weights from the holder.
    for slot, st in engine_statuses(node, s).items():
        assert st and st["state"] == "ready", (slot, st)
        assert st["engine"]["name"] == "wsup-transformers-example" and st.get("nonce"), st
        assert st["weights"]["source"] == "holder" and st["weights"]["mode"] == "daemon", st
        # It armed the death word its supervisor gave it (wsup_client.arm_death_word).
        assert st["death_word"] == "armed", st
    assert all(e.get("death_seen_by") == "death_word" for e in s["engines"]), s["engines"]
    # The supervisor recorded both attaches as cache hits.
    assert wait_for(lambda: len(node.query("select * from cache_events where result='hit'")) == 2, 10), \
        node.query("select * from cache_events")

    # A stream in flight when the active engine is SIGKILLed: the front
    # resumes it on the standby; the client sees one stream, every token once.
    active = node.engine(s, "active")
    stream = EventStream(front, {"prompt": PROMPT, "max_tokens": 150, "stream": True, "return_token_ids": True})
    try:
        assert stream.status == 200
        it = stream.events()
        events = [next(it) for _ in range(5)]
        os.kill(active["pid"], signal.SIGKILL)
        events += list(it)
    finally:
        stream.close()
    ids, finish, done = stream_tokens(events)
    assert ids == greedy(PROMPT, 150) and finish == "length" and done
    assert events.count("[DONE]") == 1
    assert wait_for(lambda: len(node.query("select * from failovers where trigger='crash'")) == 1, 10)

    # The killed slot is re-armed (a third hit), then drills, planned and crash.
    assert node.wait_serving(60), node.log()
    assert wait_for(lambda: len(node.query("select * from cache_events where result='hit'")) == 3, 10)
    for kill in (False, True):
        assert node.wait_serving(60), node.log()
        args = ["failover", "--drill", "--json"] + (["--kill"] if kill else [])
        rc, out, err = node.cli(*args)
        assert rc == 0, (out, err)
        r = json.loads(out)
        assert r["ok"] and r["from_slot"] != r["to_slot"], r
        status, j = complete(front, PROMPT)
        assert status == 200 and j["choices"][0]["token_ids"] == greedy(PROMPT, 16), j
    assert len(node.query("select * from failovers where drill=1")) == 2

    # `wsup stop`: the engines get SIGTERM, drain and exit 0; nothing is left.
    assert node.wait_serving(60), node.log()
    engines = [e["pid"] for e in node.status()["engines"]]
    assert node.stop() == 0, node.log()
    from example_engine_util import tagged_pids
    assert wait_for(lambda: not tagged_pids(node.dir), 20), tagged_pids(node.dir)
    for pid in engines:
        assert not os.path.exists("/proc/%d/status" % pid) or "zombie" in open("/proc/%d/status" % pid).read()
    log = node.log()
    for slot in ("a", "b"):
        assert re.search(r"engine %s: stopping --exited--> stopped \[none\] pid \d+ exit 0\n" % slot, log), log[-3000:]
        elog = node.engine_log(slot)  # the last engine's log of the slot
        assert "signal 15: shutting down" in elog and "stopped: " in elog and ", 0 cut" in elog, elog
