"""wsup_client.publish against a real wsup-holder --layout engine on the host
backend, with numpy only: the lease, alloc_tensor, commit in place (strides
kept), tied names committed once, values outside the lease copied, readers
in another process, a refused commit that keeps the lease, abort, a writer
SIGKILLed mid-publish handing the lease on, and errors for misuse."""

import json
import os
import select
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT, bin_dir, model_dir

import wsup_client as wc
from wsup_client.holder import start_holder

CKPT = "llama-tiny-f32"
ENGINE = {"name": "py-test-engine", "version": "1", "transform": "transposed/v1"}


@pytest.fixture
def layouts(socket_dir):
    """A wsup-holder --layout engine (host), SIGKILLed at the end."""
    binary = os.path.join(bin_dir(), "wsup-holder")
    if not os.access(binary, os.X_OK):
        pytest.fail("%s is missing: build it (ninja -C build wsup-holder) or set WSUP_BIN_DIR" % binary)
    h = start_holder(binary, None, socket_dir, args=["--layout", "engine", "--backend", "host"], name="layouts")
    yield h
    h.stop()


def begin(h, **kw):
    kw.setdefault("checkpoint_dir", model_dir(CKPT))
    kw.setdefault("engine", ENGINE)
    kw.setdefault("wait_ms", 0)
    return wc.publish(h.socket, "daemon", **kw)


def address(a):
    return a.__array_interface__["data"][0]


def test_commit_records_in_place_ties_once_copies_the_rest_and_readers_see_it(layouts):
    pub = begin(layouts)
    assert pub.has_lease and not pub.attached and pub.attachment is None
    assert not pub.is_cuda
    w = pub.alloc_tensor((4, 6), "F32")
    w[...] = np.arange(24, dtype=np.float32).reshape(4, 6)
    raw = pub.alloc_tensor((3,), "BF16")  # raw bits as uint16
    assert raw.dtype == np.uint16
    raw[...] = [0x3F80, 0x4000, 0x4040]   # 1.0, 2.0, 3.0 in bfloat16
    outside = np.linspace(0, 1, 10, dtype=np.float32)
    assert pub.locate(address(w)) is not None
    assert pub.locate(address(outside)) is None

    att = pub.commit({
        "w": w,
        "w.t": w.T,              # the same bytes, transposed: recorded in place with strides
        "w.again": w,            # the same view: tied, committed once
        "raw": raw,              # remembered as BF16 from alloc_tensor
        "outside": outside,      # not in the lease: copied
        "row1": w[1],            # inside, but at offset 24: copied (offsets are multiples of 256)
        "scalar": np.float32(7.5).reshape(()),
    })
    r = att.report
    assert sorted(r.in_place) == ["raw", "w"]
    assert r.tied == {"w.again": "w"}
    assert sorted(r.copied) == ["outside", "row1", "scalar", "w.t"]
    assert "overlaps 'w'" in r.reasons["w.t"]
    assert "not in the lease" in r.reasons["outside"]
    assert "is not a multiple of 256" in r.reasons["row1"]
    assert r.copied_bytes == 24 * 4 + 40 + 24 + 4
    assert att.source == "published" and pub.attached and not pub.has_lease

    # In place: the layout's tensors are the writer's arrays, now read-only.
    assert att.data_ptr("w") == address(w)
    assert not w.flags.writeable
    with pytest.raises(ValueError):
        w[0, 0] = 1
    assert sorted(att.names()) == ["outside", "raw", "row1", "scalar", "w", "w.t"]
    assert att.info("raw").dtype == "BF16"
    np.testing.assert_array_equal(att.numpy("w"), np.arange(24, dtype=np.float32).reshape(4, 6))
    np.testing.assert_array_equal(att.numpy("w.t"), np.arange(24, dtype=np.float32).reshape(4, 6).T)
    np.testing.assert_array_equal(att.numpy("outside"), outside)
    np.testing.assert_array_equal(att.numpy("row1"), np.arange(6, 12, dtype=np.float32))
    assert att.numpy("scalar").shape == () and float(att.numpy("scalar")) == 7.5

    # A reader in another process: the same names, bytes and shapes.
    code = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import wsup_client as wc
att = wc.attach(sys.argv[2], "daemon", checkpoint_dir=sys.argv[3], engine=json.loads(sys.argv[4]))
out = {n: att.numpy(n).tolist() for n in att.names()}
out["_source"] = att.source
out["_strides"] = att.info("w").strides
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "client", "python"), layouts.socket,
                          model_dir(CKPT), json.dumps(ENGINE)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["_source"] == "holder"
    assert got["_strides"] is None
    assert got["w"] == np.arange(24).reshape(4, 6).tolist()
    assert got["raw"] == [0x3F80, 0x4000, 0x4040]
    assert got["w.t"] == np.arange(24).reshape(4, 6).T.tolist()

    # A later publisher of the same fingerprint attaches the committed layout.
    again = begin(layouts)
    assert again.attached and not again.has_lease and again.source == "holder"
    assert again.attachment.info("w").shape == (4, 6)


def test_a_transposed_tensor_alone_is_committed_in_place_with_its_strides(layouts):
    pub = begin(layouts)
    base = pub.alloc_tensor((3, 5), "F32")
    base[...] = np.arange(15, dtype=np.float32).reshape(3, 5)
    att = pub.commit({"t": base.T})
    assert att.report.in_place == ["t"] and att.report.copied == []
    # The grant alloc_tensor asked for took a holder round trip: it is timed.
    assert att.report.grant_ms > 0
    assert att.info("t").strides == (1, 5)
    assert att.data_ptr("t") == address(base)
    np.testing.assert_array_equal(att.numpy("t"), np.arange(15, dtype=np.float32).reshape(3, 5).T)
    np.testing.assert_array_equal(att.copy_to_host("t"), np.arange(15, dtype=np.float32).reshape(3, 5).T)


def test_a_refused_commit_keeps_the_lease_and_the_arrays_then_abort_hands_it_on(layouts):
    pub = begin(layouts)
    w = pub.alloc_tensor((8,), "F32")
    w[...] = 3.0
    with pytest.raises(wc.WsupError) as e:
        pub.commit({"bad\nname": w})
    assert "the lease is kept" in str(e.value)
    assert pub.has_lease
    w[0] = 4.0  # still writable, still in place
    att = pub.commit({"w": w})
    assert att.report.in_place == ["w"]
    np.testing.assert_array_equal(att.numpy("w"), [4.0] + [3.0] * 7)
    with pytest.raises(wc.WsupError, match="only a publication that holds the lease writes"):
        pub.commit({"w": w})

    other = begin(layouts, revision="r2")
    assert other.has_lease
    other.alloc_tensor((16,), "F32")
    other.abort("changed my mind")
    assert not other.has_lease
    with pytest.raises(wc.WsupError, match="holds no write lease"):
        other.alloc_tensor((1,), "F32")
    third = begin(layouts, revision="r2")
    assert third.has_lease
    third.close()


def test_misuse_is_refused_with_the_fix(layouts):
    with pytest.raises(wc.WsupError) as e:
        wc.publish(layouts.socket, "daemon", checkpoint_dir=model_dir(CKPT), wait_ms=0)
    assert e.value.code == wc.INVALID_ARGUMENT and "'engine' and 'engine_version'" in str(e.value)
    with pytest.raises(wc.WsupError, match="name and version are required"):
        begin(layouts, engine={"name": "x"})
    with pytest.raises(wc.WsupError, match="unknown keys"):
        begin(layouts, engine={"name": "x", "version": "1", "flavour": "y"})
    with pytest.raises(wc.WsupError, match="not one of daemon"):
        wc.publish(layouts.socket, "sometimes", checkpoint_dir=model_dir(CKPT), engine=ENGINE)
    # A cuda fingerprint on a host holder: a mismatch naming the backend.
    with pytest.raises(wc.WsupError) as e:
        wc.publish(layouts.socket, "daemon", fingerprint={"checkpoint": "0123", "backend": "cuda"}, engine=ENGINE,
                   wait_ms=0)
    assert e.value.code == wc.MISMATCH and "names backend cuda" in str(e.value)

    pub = begin(layouts)
    with pytest.raises(wc.WsupError, match="torch_pool needs a cuda lease"):
        with pub.torch_pool():
            pass
    with pytest.raises(wc.WsupError, match="is not one of"):
        pub.alloc_tensor((2,), "Q4")
    with pytest.raises(wc.WsupError, match="not a torch tensor or numpy array"):
        pub.commit({"x": [1, 2, 3]})
    u16 = np.zeros(4, dtype=np.uint16)
    with pytest.raises(wc.WsupError, match="names none of the dtypes a layout holds"):
        pub.commit({"plain": u16})
    with pytest.raises(wc.WsupError, match="names none of the dtypes"):
        pub.commit({"plain": u16}, dtypes={"plain": "F32"})  # F32 items are 4 bytes
    assert pub.has_lease
    att = pub.commit({"named": np.ones(4, dtype=np.uint16), "i8": np.arange(3, dtype=np.int8)},
                     dtypes={"named": "BF16"})
    assert att.info("named").dtype == "BF16" and att.info("i8").dtype == "I8"
    assert sorted(att.report.copied) == ["i8", "named"]
    # Client mode: another writer holds the lease, no wait: load from disk.
    busy = begin(layouts, revision="r3")
    assert busy.has_lease
    later = wc.publish(layouts.socket, "client", checkpoint_dir=model_dir(CKPT), engine=ENGINE, revision="r3",
                       wait_ms=0)
    assert not later.attached and not later.has_lease and "being written" in later.reason


WRITER = r"""
import sys
sys.path.insert(0, sys.argv[1])
import wsup_client as wc
pub = wc.publish(sys.argv[2], "daemon", checkpoint_dir=sys.argv[3], engine={"name": "py-test-engine",
                 "version": "1", "transform": "transposed/v1"}, wait_ms=0)
a = pub.alloc_tensor((1024,), "F32")
a[...] = 1.0
print("granted", flush=True)
sys.stdin.read()  # until killed
"""


def test_a_writer_killed_mid_publish_hands_the_lease_to_the_next(layouts):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, os.path.join(ROOT, "client", "python"), layouts.socket,
                             model_dir(CKPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "the writer did not report its grant within 60 s"
        assert proc.stdout.readline().strip() == b"granted", proc.stderr.read()
        # Someone else asks meanwhile: the writer is named.
        with pytest.raises(wc.WsupError, match="is being written"):
            begin(layouts)
        proc.kill()
        proc.wait(timeout=30)
        # The holder notices the writer's connection close and releases the
        # layout; a waiting publisher then gets the lease (bounded wait).
        deadline = time.monotonic() + 30
        pub = begin(layouts, wait_ms=20000)
        assert pub.has_lease
        assert time.monotonic() < deadline
        a = pub.alloc_tensor((4,), "F32")
        a[...] = 2.0
        att = pub.commit({"a": a})
        np.testing.assert_array_equal(att.numpy("a"), [2.0] * 4)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stdin.close()
        proc.stdout.close()
        proc.stderr.close()
