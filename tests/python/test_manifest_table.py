"""The manifest as the Python client reads it (wsup_manifest_table, one call)
against the per-tensor calls of the C ABI, for every test checkpoint, on real
wsup-holder processes (host backend); the reader's refusals of a block it
cannot read; the client without numpy."""

import ctypes
import gc
import hashlib
import os
import struct

import numpy as np
import pytest

from conftest import model_dir, tensors_json
from test_host_attach import TORCH_TO_ST, arena_mappings, run_python

import wsup_client as wc
from wsup_client import _attach

TESTDATA = os.path.dirname(model_dir("llama-tiny-f32"))
# Every test checkpoint a holder serves; per-tensor FP8 is refused for sharing by design.
REFUSED = {"llama-tiny-fp8-pertensor"}
MODELS = sorted(d for d in os.listdir(TESTDATA)
                if os.path.isfile(os.path.join(TESTDATA, d, "tensors.json")) and d not in REFUSED)


def per_tensor_answers(att):
    """Every tensor as the per-tensor C calls answer: name -> (dtype, shape,
    strides, nbytes, data), in wsup_tensor_name order."""
    lib, p = att._handle.lib, ctypes.c_void_p(att._handle.ptr)
    out = {}
    for i in range(lib.wsup_num_tensors(p)):
        b = lib.wsup_tensor_name(p, i)
        ndim = lib.wsup_tensor_ndim(p, b)
        out[b.decode()] = (lib.wsup_tensor_dtype(p, b).decode(), tuple(lib.wsup_tensor_dim(p, b, d) for d in range(ndim)),
                           tuple(lib.wsup_tensor_stride(p, b, d) for d in range(ndim)),
                           lib.wsup_tensor_nbytes(p, b), lib.wsup_tensor_data(p, b) or 0)
    return out


def contiguous(shape):
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


def test_the_test_checkpoints_are_here():
    # The parametrized test below covers what is there; this one fails if the data went missing.
    assert {"llama-tiny-f32", "llama-tiny-bf16-sharded", "llama-tiny-fp8-block", "qwen3moe-tiny-f32",
            "deepseekv3-tiny-fp8-block"} <= set(MODELS)


@pytest.mark.parametrize("model", MODELS)
def test_the_manifest_says_what_the_per_tensor_calls_say(holder, model):
    h = holder(model)
    att = wc.attach(h.socket, "daemon", checkpoint_dir=model_dir(model))
    assert _attach._MANIFEST_READER == "table"
    want = per_tensor_answers(att)
    assert att.names() == list(want)  # manifest order
    assert len(att) == len(want)
    files = tensors_json(model)
    assert sorted(want) == sorted(files)
    for name, (dtype, shape, strides, nbytes, data) in want.items():
        inf = att.info(name)
        assert (inf.name, inf.dtype, inf.shape, inf.nbytes, inf.data_ptr) == (name, dtype, shape, nbytes, data), name
        assert strides == contiguous(shape), name  # checkpoint tensors are stored contiguous
        assert att.data_ptr(name) == data != 0 or nbytes == 0, name
        assert name in att
        assert dtype == TORCH_TO_ST.get(files[name]["dtype"], dtype) and list(shape) == files[name]["shape"], name
    assert "no.such.tensor" not in att

    # The arrays are those of the per-tensor reader: same memory, shapes and bytes.
    arrays = att.tensors()
    old = wc.attach(h.socket, "daemon", checkpoint_dir=model_dir(model))
    old_reader = _attach._MANIFEST_READER
    _attach._MANIFEST_READER = "per-tensor"
    try:
        before = old.tensors()
    finally:
        _attach._MANIFEST_READER = old_reader
    assert list(arrays) == list(before)
    for name, a in arrays.items():
        b = before[name]
        assert (a.dtype, a.shape, a.flags.writeable, a.flags.c_contiguous) == (b.dtype, b.shape, False, True), name
        assert a.__array_interface__["data"][0] == want[name][4] or a.nbytes == 0, name
        assert hashlib.sha256(a.tobytes()).hexdigest() == files[name]["sha256"], name
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), name


def test_the_per_tensor_reader_still_answers_the_same(holder, monkeypatch):
    h = holder("llama-tiny-fp8-block")
    att = wc.attach(h.socket, "daemon", checkpoint_dir=model_dir("llama-tiny-fp8-block"))
    want = per_tensor_answers(att)
    monkeypatch.setattr(_attach, "_MANIFEST_READER", "per-tensor")
    assert att.names() == list(want)
    for name, (dtype, shape, _, nbytes, data) in want.items():
        inf = att.info(name)
        assert (inf.dtype, inf.shape, inf.nbytes, inf.data_ptr) == (dtype, shape, nbytes, data), name


def test_close_gives_up_the_mapping_while_the_attachment_lives(holder):
    h = holder("llama-tiny-f32")
    att = wc.attach(h.socket, "daemon", checkpoint_dir=model_dir("llama-tiny-f32"))
    arrays = att.tensors()
    assert arena_mappings()
    att.close()
    assert arena_mappings(), "unmapped while arrays still use it"
    del arrays
    gc.collect()
    assert arena_mappings() == [], "the closed attachment still holds the mapping"
    with pytest.raises(wc.WsupError, match="closed"):
        att.names()


class _Block:
    """A fake library whose wsup_manifest_table returns a block made here."""

    def __init__(self, block, count):
        self.buf = ctypes.create_string_buffer(block, len(block))
        self.count = count

    def wsup_manifest_table(self, p, size):
        size._obj.value = len(self.buf)
        return ctypes.addressof(self.buf)

    def wsup_num_tensors(self, p):
        return self.count


def block(magic=b"wsupMTAB", version=1, names=(b"w",), dims_index=0, name_offset=4, flags=0):
    """A version-1 block of one F32 [2, 3] tensor named names[0]; fields as given."""
    strings = b"F32\0" + b"".join(n + b"\0" for n in names)
    dims = struct.pack("=4q", 2, 3, 3, 1)
    rec = struct.pack("=8Q", 0x1000, 24, name_offset, 1, 0, 3, 2, dims_index)
    dims_offset = 64 + len(rec)
    strings_offset = dims_offset + len(dims)
    total = strings_offset + len(strings)
    header = struct.pack("=8sIIIIQQQQQ", magic, version, 64, 64, flags, 1, dims_offset, strings_offset,
                         len(strings), total)
    return header + rec + dims + strings


def scalar_and_matrix(flags):
    """A block of a scalar "s" then an F32 [2, 3] "w": with flags 0 the
    scalar's dims index is the matrix's (as an older library wrote it), with
    _TABLE_DIMS_UNIQUE it has one unused element of its own."""
    pad = 1 if flags & _attach._TABLE_DIMS_UNIQUE else 0
    strings = b"F32\0s\0w\0"
    dims = struct.pack("=%dq" % (pad + 4), *([0] * pad + [2, 3, 3, 1]))
    recs = (struct.pack("=8Q", 0x1000, 4, 4, 1, 0, 3, 0, 0) +
            struct.pack("=8Q", 0x2000, 24, 6, 1, 0, 3, 2, pad))
    dims_offset = 64 + len(recs)
    strings_offset = dims_offset + len(dims)
    header = struct.pack("=8sIIIIQQQQQ", b"wsupMTAB", 1, 64, 64, flags, 2, dims_offset, strings_offset,
                         len(strings), strings_offset + len(strings))
    return header + recs + dims + strings


@pytest.mark.parametrize("flags", [0, 2], ids=["shared-dims-index", "unique-dims-index"])
def test_the_reader_reads_a_block_made_by_hand_and_refuses_bad_ones(flags):
    m = _attach._read_table(_Block(block(flags=flags), 1), None)
    assert (m.names, m.dtypes, m.shapes, list(m.nbytes), list(m.data)) == (["w"], ["F32"], [(2, 3)], [24], [0x1000])
    m = _attach._read_table(_Block(scalar_and_matrix(flags), 2), None)
    assert (m.names, m.shapes, list(m.nbytes), list(m.data)) == (["s", "w"], [(), (2, 3)], [4, 24], [0x1000, 0x2000])
    assert m.info("w").data_ptr == 0x2000 and m.info("s").shape == ()
    bad = [
        (_Block(block(magic=b"wsupXXXX"), 1), "magic"),
        (_Block(block(version=2, flags=flags), 1), "version 2"),
        (_Block(block(), 2), "bounds"),  # the library counts another number of tensors
        (_Block(block()[:40], 1), "less than a header"),
        (_Block(block(names=(b"w", b"x")), 1), "2 names for 1 tensors"),
        (_Block(block(dims_index=3, flags=flags), 1), "past the 4 dims"),
        (_Block(block(name_offset=99), 1), "past the"),
    ]
    for lib, says in bad:
        with pytest.raises(wc.WsupError, match=says) as e:
            _attach._read_table(lib, None)
        assert e.value.code == wc.CORRUPT
        assert "different wsup versions" in str(e.value)


def test_the_table_of_a_null_or_unattached_handle_is_null(socket_dir):
    _, lib = wc.load_library()
    size = ctypes.c_size_t(7)
    assert lib.wsup_manifest_table(None, ctypes.byref(size)) is None and size.value == 0
    off = wc.attach(os.path.join(socket_dir, "nobody.sock"), "off")
    size.value = 7
    assert lib.wsup_manifest_table(off._handle.ptr, ctypes.byref(size)) is None and size.value == 0
    assert lib.wsup_manifest_table(off._handle.ptr, None) is None
    with pytest.raises(wc.WsupError, match="load the weights from disk"):
        off.names()


def test_without_numpy_the_manifest_and_lookups_work(holder):
    # A torch engine need not have numpy: everything but numpy arrays works without it.
    h = holder("llama-tiny-bf16-sharded")
    code = """
import sys
sys.modules["numpy"] = None  # importing numpy now fails, as where it is not installed
import wsup_client as wc
att = wc.attach(%r, "daemon", checkpoint_dir=%r)
names = att.names()
inf = att.info("model.embed_tokens.weight")
assert len(att) == len(names) == 21 and "lm_head.weight" in att, names
assert inf.dtype == "BF16" and inf.shape == (256, 256) and inf.nbytes == 2 * 256 * 256 and inf.data_ptr
try:
    att.tensors("numpy")
except ImportError:
    print("numpy arrays need numpy")
print("ok", len(names))
""" % (h.socket, model_dir("llama-tiny-bf16-sharded"))
    r = run_python(code, {})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["numpy", "arrays", "need", "numpy", "ok", "21"]
    assert "numpy" not in r.stderr
