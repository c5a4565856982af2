"""The Python client against real wsup-holder processes on the host backend:
every array is the holder's bytes (sha256 of tensors.json), in the holder's
memory (no copy), alive as long as an array is; the three modes; clear errors
for bad inputs."""

import gc
import hashlib
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, model_dir, tensors_json

import wsup_client as wc
from wsup_client import _dlpack

BF16 = "llama-tiny-bf16-sharded"
F32 = "llama-tiny-f32"
FP8 = "llama-tiny-fp8-block"

# tensors.json spells dtypes as torch does; the manifest as safetensors does.
TORCH_TO_ST = {"float32": "F32", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float16": "F16"}


def arena_mappings():
    """(start, end) of this process's mappings of a holder's memfd arena."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            if "memfd:wsup-arena" in line:
                lo, hi = line.split()[0].split("-")
                out.append((int(lo, 16), int(hi, 16)))
    return out


def sha(a):
    return hashlib.sha256(memoryview(np.ascontiguousarray(a)).cast("B")).hexdigest()


def test_every_array_equals_its_sha256_and_lives_in_the_arena(holder):
    h = holder(BF16)
    want = tensors_json(BF16)
    att = wc.attach(h.socket, "daemon", checkpoint_dir=model_dir(BF16))
    assert att.from_holder and att.source == "holder" and att.reason == "" and att.diffs == []
    assert not att.is_cuda
    arrays = att.tensors()
    assert sorted(arrays) == sorted(want)
    maps = arena_mappings()
    assert maps, "no memfd arena is mapped in this process"
    for name, a in arrays.items():
        w = want[name]
        inf = att.info(name)
        assert inf.dtype == TORCH_TO_ST[w["dtype"]], name
        assert list(a.shape) == w["shape"], name
        assert sha(a) == w["sha256"], name
        # No copy: the array's memory is the library's pointer, inside the mapping.
        ptr = a.__array_interface__["data"][0]
        assert ptr == att.data_ptr(name) != 0, name
        assert any(lo <= ptr and ptr + a.nbytes <= hi for lo, hi in maps), name
        assert not a.flags.writeable, name
        assert not a.flags.owndata, name
    emb = arrays["model.embed_tokens.weight"]
    assert emb.dtype == np.uint16  # BF16 as its raw bits
    with pytest.raises(ValueError):
        emb[0, 0] = 1


def test_arrays_outlive_close_and_the_holder_and_unmap_with_the_last_one(holder):
    h = holder(F32)
    want = tensors_json(F32)
    att = wc.attach(h.socket, "client", checkpoint_dir=model_dir(F32))
    assert att.from_holder
    keep = {n: att.numpy(n) for n in ("model.embed_tokens.weight", "lm_head.weight")}
    att.close()
    with pytest.raises(wc.WsupError, match="closed"):
        att.numpy("lm_head.weight")
    del att
    gc.collect()
    assert h.kill(signal.SIGKILL) == -signal.SIGKILL
    for n, a in keep.items():
        assert sha(a) == want[n]["sha256"], n
    assert arena_mappings(), "the arena was unmapped while arrays still use it"
    del keep, a
    gc.collect()
    assert arena_mappings() == [], "the arena is still mapped after its last array is gone"


def test_client_mode_mismatch_returns_reason_and_differing_fields(holder):
    h = holder(BF16, "--revision", "r1")
    att = wc.attach(h.socket, "client", checkpoint_dir=model_dir(BF16), revision="r2")
    assert not att.from_holder
    assert att.source == "disk"
    assert att.reason.startswith("fingerprint mismatch") and "revision" in att.reason
    assert att.diffs == [{"field": "revision", "ours": "r2", "holder": "r1"}]
    assert len(att) == 0 and "model.embed_tokens.weight" not in att
    with pytest.raises(wc.WsupError, match="load the weights from disk"):
        att.tensors()

    # The same in daemon mode is an error naming the field.
    with pytest.raises(wc.WsupError) as e:
        wc.attach(h.socket, "daemon", checkpoint_dir=model_dir(BF16), revision="r2")
    assert e.value.code == wc.MISMATCH and "revision" in str(e.value)

    # A fingerprint given as JSON: the holder's own, with two fields changed.
    ok = wc.attach(h.socket, "client", checkpoint_dir=model_dir(BF16), revision="r1")
    assert ok.from_holder
    fp = dict(ok.holder_fingerprint)
    fp["tp_size"], fp["dtype"] = "2", "float32"
    miss = wc.attach(h.socket, "client", fingerprint=fp)
    assert not miss.from_holder
    assert sorted((d["field"], d["ours"], d["holder"]) for d in miss.diffs) == [
        ("dtype", "float32", "bfloat16"), ("tp_size", "2", "1")]
    same = wc.attach(h.socket, "daemon", fingerprint=ok.holder_fingerprint)
    assert same.from_holder and len(same) == len(tensors_json(BF16))


def test_modes_without_a_holder(socket_dir):
    missing = os.path.join(socket_dir, "nobody.sock")
    off = wc.attach(missing, "off")
    assert not off.from_holder and off.reason == "mode off" and off.source == "disk"

    client = wc.attach(missing, "client", checkpoint_dir=model_dir(BF16))
    assert not client.from_holder
    assert client.reason.startswith("holder unavailable") and missing in client.reason

    with pytest.raises(wc.WsupError) as e:
        wc.attach(missing, "daemon", checkpoint_dir=model_dir(BF16))
    assert missing in str(e.value)
    assert e.value.code in (wc.UNAVAILABLE, wc.IO, wc.NOT_FOUND)


def test_bad_inputs_give_clear_errors(holder, socket_dir):
    h = holder(BF16)
    with pytest.raises(wc.WsupError) as e:
        wc.attach(h.socket, "sometimes", checkpoint_dir=model_dir(BF16))
    assert e.value.code == wc.INVALID_ARGUMENT
    assert "'sometimes'" in str(e.value) and "daemon, client, off" in str(e.value)

    with pytest.raises(wc.WsupError, match="exactly one of") as e:
        wc.attach(h.socket, "daemon", checkpoint_dir=model_dir(BF16), fingerprint={"tp_size": "1"})
    assert e.value.code == wc.INVALID_ARGUMENT

    with pytest.raises(wc.WsupError) as e:
        wc.attach(h.socket, "daemon", checkpoint_dir=os.path.join(socket_dir, "no-such-model"))
    assert "no-such-model" in str(e.value)

    att = wc.attach(h.socket, "daemon", checkpoint_dir=model_dir(BF16))
    with pytest.raises(KeyError) as e:
        att.numpy("model.layers.9.mlp.up_proj.weight")
    msg = str(e.value)
    assert "'model.layers.9.mlp.up_proj.weight' is not in the holder's manifest (21 tensors)" in msg
    assert "model.layers.0.mlp.up_proj.weight" in msg  # a name that exists, as a hint
    with pytest.raises(wc.WsupError, match="one of numpy, torch"):
        att.tensors("pandas")


def run_python(code, env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    env["PYTHONPATH"] = os.path.join(ROOT, "client", "python")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_a_missing_library_names_the_fix(socket_dir):
    gone = os.path.join(socket_dir, "libwsup_client.so")
    r = run_python("import wsup_client as wc; wc.attach('/x', 'off')", {"WSUP_CLIENT_LIB": gone})
    assert r.returncode != 0
    assert "LibraryNotFoundError" in r.stderr
    assert gone in r.stderr and "WSUP_CLIENT_LIB" in r.stderr
    assert "ninja -C build wsup_client_shared" in r.stderr

    not_a_lib = os.path.join(socket_dir, "junk.so")
    with open(not_a_lib, "w") as f:
        f.write("not a library")
    with pytest.raises(wc.LibraryNotFoundError, match="exists but does not load"):
        wc.load_library(not_a_lib)
    # The library found by default (from the environment ctest sets) works.
    path, _ = wc.load_library()
    assert os.path.isfile(path) or path == wc.LIB_NAME
    assert wc.library_version().count(".") == 2


def test_dlpack_export_is_zero_copy_and_keeps_the_mapping(holder):
    if not hasattr(np, "from_dlpack"):
        pytest.skip("numpy %s has no from_dlpack (needs 1.22)" % np.__version__)
    h = holder(F32)
    want = tensors_json(F32)
    att = wc.attach(h.socket, "daemon", checkpoint_dir=model_dir(F32))
    before = _dlpack.live_exports()
    name = "model.layers.1.mlp.down_proj.weight"
    a = np.from_dlpack(att.dlpack(name))
    assert a.__array_interface__["data"][0] == att.data_ptr(name)
    assert a.dtype == np.float32 and list(a.shape) == want[name]["shape"]
    assert sha(a) == want[name]["sha256"]
    assert _dlpack.live_exports() == before + 1
    # An export nobody consumes is released by its capsule.
    cap = att.dlpack(name).__dlpack__()
    assert _dlpack.live_exports() == before + 2
    del cap
    gc.collect()
    assert _dlpack.live_exports() == before + 1
    att.close()
    del att
    gc.collect()
    h.kill()
    assert sha(a) == want[name]["sha256"]
    del a
    gc.collect()
    assert _dlpack.live_exports() == before
    assert arena_mappings() == []


def test_bf16_and_block_fp8_decode_to_the_f32_weights(holder):
    f32 = wc.attach(holder(F32, name="f32").socket, "daemon", checkpoint_dir=model_dir(F32))
    bf16 = wc.attach(holder(BF16, name="bf16").socket, "daemon", checkpoint_dir=model_dir(BF16))
    fp8 = wc.attach(holder(FP8, name="fp8").socket, "daemon", checkpoint_dir=model_dir(FP8))
    ref = f32.tensors()

    for name, raw in bf16.tensors().items():
        got = wc.to_float32(raw, "BF16")
        # bfloat16 keeps 8 significant bits: relative error at most 2^-8.
        assert np.allclose(got, ref[name], rtol=2.0 ** -8, atol=0), name

    raw = fp8.tensors()
    want = tensors_json(FP8)
    assert {n for n in raw if n.endswith("_scale_inv")} == {
        n + "_scale_inv" for n in raw if fp8.info(n).dtype == "F8_E4M3"}
    for n, a in raw.items():
        assert sha(a) == want[n]["sha256"], n
    deq = wc.dequantize_checkpoint(raw)
    assert sorted(deq) == sorted(ref)
    for name, w in deq.items():
        if fp8.info(name).dtype == "F8_E4M3":
            # e4m3 keeps 4 significant bits; the block scale maps the block's
            # largest magnitude near 448, so small values lose more.
            scale = raw[name + "_scale_inv"]
            assert w.dtype == np.float32 and w.shape == ref[name].shape
            err = np.abs(w - ref[name])
            assert float(err.max()) <= float(np.abs(ref[name]).max()) * 2.0 ** -4 + float(scale.max()), name
            assert float(err.mean()) < float(np.abs(ref[name]).mean()) * 0.03, name
        else:
            assert deq[name] is raw[name]  # passed through, no copy
            assert np.allclose(wc.to_float32(w, "BF16"), ref[name], rtol=2.0 ** -8, atol=0), name


def test_fp8_and_bf16_decoding_tables():
    e4m3 = wc.to_float32(np.array([0x00, 0x01, 0x08, 0x38, 0x40, 0x7E, 0xB8, 0xFE], np.uint8), "F8_E4M3")
    assert list(e4m3) == [0.0, 2.0 ** -9, 2.0 ** -6, 1.0, 2.0, 448.0, -1.0, -448.0]
    assert np.isnan(wc.to_float32(np.array([0x7F, 0xFF], np.uint8), "F8_E4M3")).all()
    e5m2 = wc.to_float32(np.array([0x3C, 0x7B, 0x7C, 0x01], np.uint8), "F8_E5M2")
    assert list(e5m2) == [1.0, 57344.0, float("inf"), 2.0 ** -16]
    assert list(wc.to_float32(np.array([0x3F80, 0xC000, 0x7F80], np.uint16), "BF16")) == [1.0, -2.0, float("inf")]
    # A 3x5 weight in 2x2 blocks: the edge blocks are partial.
    w = np.full((3, 5), 0x38, np.uint8)  # every value 1.0
    s = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    d = wc.dequantize_block_fp8(w, s, (2, 2))
    assert d.tolist() == [[1, 1, 2, 2, 3], [1, 1, 2, 2, 3], [4, 4, 5, 5, 6]]
    with pytest.raises(ValueError, match="needs"):
        wc.dequantize_block_fp8(w, s[:1], (2, 2))
