"""torch tensors from a host-backend holder (DLPack on the CPU) and
bind_module on a small Llama written here, built on the meta device: bound to
the attached llama-tiny-f32 tensors it must produce the golden greedy
outputs. Needs torch; skipped with a message where torch is not installed
(the GPU path is tests/python/gpu_torch_check.py)."""

import gc
import os

import numpy as np
import pytest

from conftest import golden, model_dir

import wsup_client as wc
from wsup_client import _dlpack

try:
    import torch
    from torch import nn
except ImportError:
    pytest.skip("torch is not installed on this machine, so the torch tests are skipped; "
                "tests/python/gpu_torch_check.py runs them with torch on a GPU machine",
                allow_module_level=True)

from tiny_llama import Rotary, TinyLlama, read_config  # noqa: E402 (needs torch)

F32 = "llama-tiny-f32"
BF16 = "llama-tiny-bf16-sharded"


def load_config(name, **overrides):
    return read_config(os.path.join(model_dir(name), "config.json"), **overrides)



# ---------------------------------------------------------------- tests

def test_torch_tensors_are_the_arena(holder):
    h = holder(BF16)
    att = wc.attach(h.socket, "daemon", checkpoint_dir=model_dir(BF16))
    ts = att.tensors("torch")
    for name, t in ts.items():
        assert t.device.type == "cpu"
        assert t.data_ptr() == att.data_ptr(name), name
        assert t.dtype == torch.bfloat16 and list(t.shape) == list(att.info(name).shape), name
        want = wc.to_float32(att.numpy(name), "BF16")
        assert np.array_equal(t.float().numpy(), want), name
    copies = {n: t.clone() for n, t in ts.items()}
    live = _dlpack.live_exports()
    assert live >= len(ts)
    att.close()
    del att
    h.kill()
    gc.collect()
    for name, t in ts.items():  # still readable, still the same bytes
        assert torch.equal(t, copies[name]), name
    n = len(ts)
    del ts, t
    gc.collect()
    assert _dlpack.live_exports() == live - n


def test_bound_meta_model_generates_the_golden_outputs_after_the_holder_dies(holder):
    h = holder(F32)
    att = wc.attach(h.socket, "client", checkpoint_dir=model_dir(F32))
    assert att.from_holder, att.reason
    model = TinyLlama(load_config(F32))
    assert model.model.rotary_emb.inv_freq.is_meta
    tensors = att.tensors("torch")
    report = wc.bind_module(model, tensors)
    assert len(report.bound) == len(tensors) and report.tied == []
    assert report.materialized == ["model.rotary_emb.inv_freq"]
    for name, p in model.named_parameters():
        assert p.data_ptr() == att.data_ptr(name), name  # no copy
        assert not p.requires_grad
    fresh = Rotary(load_config(F32), device="cpu").inv_freq
    assert torch.equal(model.model.rotary_emb.inv_freq, fresh)
    att.close()
    del tensors
    cases = golden(F32)["cases"]
    for c in cases:
        assert model.greedy(c["prompt_ids"], len(c["output_ids"])) == c["output_ids"], c["prompt"]
    h.kill()
    gc.collect()
    for c in cases:
        assert model.greedy(c["prompt_ids"], len(c["output_ids"])) == c["output_ids"], c["prompt"]


def test_tied_embeddings_bind_once_and_stay_tied(holder):
    h = holder(F32)
    att = wc.attach(h.socket, "daemon", checkpoint_dir=model_dir(F32))
    model = TinyLlama(load_config(F32, tie_word_embeddings=True))
    # A tied checkpoint has no lm_head.weight.
    report = wc.bind_module(model, att.tensors("torch"), rename=lambda n: None if n == "lm_head.weight" else n)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.data_ptr() == att.data_ptr("model.embed_tokens.weight")
    assert ("lm_head.weight", "model.embed_tokens.weight") in report.tied
    # With lm_head.weight present too, it is taken as the same tensor's alias.
    model2 = TinyLlama(load_config(F32, tie_word_embeddings=True))
    wc.bind_module(model2, att.tensors("torch"))
    assert model2.lm_head.weight is model2.model.embed_tokens.weight


def test_bind_errors_list_every_problem_and_change_nothing(holder):
    h = holder(F32)
    att = wc.attach(h.socket, "daemon", checkpoint_dir=model_dir(F32))
    tensors = att.tensors("torch")
    del tensors["model.norm.weight"]
    tensors["model.layers.7.mlp.up_proj.weight"] = tensors["lm_head.weight"]
    model = TinyLlama(load_config(F32, intermediate_size=512))
    with pytest.raises(wc.WsupError) as e:
        wc.bind_module(model, tensors)
    msg = str(e.value)
    assert "1 missing from the checkpoint: model.norm.weight" in msg
    assert "1 in the checkpoint but not in the module: model.layers.7.mlp.up_proj.weight" in msg
    assert "model.layers.0.mlp.up_proj.weight: checkpoint shape [576, 256], module [512, 256]" in msg
    assert e.value.missing == ["model.norm.weight"]
    assert all(p.is_meta for p in model.parameters())  # nothing was bound

    ok = att.tensors("torch")
    wrong_dtype = dict(ok, **{"model.norm.weight": ok["model.norm.weight"].to(torch.float64)})
    with pytest.raises(wc.WsupError, match="model.norm.weight: checkpoint dtype torch.float64"):
        wc.bind_module(TinyLlama(load_config(F32)), wrong_dtype)
    with pytest.raises(wc.WsupError, match="not a torch.Tensor"):
        wc.bind_module(TinyLlama(load_config(F32)), att.tensors("numpy"))
    report = wc.bind_module(TinyLlama(load_config(F32)), dict(ok, extra_scale=ok["model.norm.weight"]),
                            ignore_extra=["extra_*"])
    assert report.ignored == ["extra_scale"]


class NoConfigRotary(nn.Module):
    def __init__(self, hd, device):
        super().__init__()
        self.register_buffer("inv_freq", torch.arange(0, hd, 2, device=device).float(), persistent=False)
        self.cache = torch.zeros(3, device=device)  # a plain tensor attribute


def test_buffers_without_a_config_need_materialize(holder):
    h = holder(F32)
    att = wc.attach(h.socket, "daemon", checkpoint_dir=model_dir(F32))
    model = TinyLlama(load_config(F32))
    model.model.rotary_emb = NoConfigRotary(64, "meta")
    with pytest.raises(wc.WsupError) as e:
        wc.bind_module(model, att.tensors("torch"))
    assert "model.rotary_emb (NoConfigRotary)" in str(e.value) and "materialize=" in str(e.value)
    assert model.model.embed_tokens.weight.is_meta

    calls = []

    def make(mod, device):
        calls.append(device)
        return {"inv_freq": torch.arange(0, 64, 2).float(), "@cache": torch.ones(3)}

    report = wc.bind_module(model, att.tensors("torch"), materialize={NoConfigRotary: make})
    assert calls == [torch.device("cpu")]
    assert sorted(report.materialized) == ["model.rotary_emb.cache", "model.rotary_emb.inv_freq"]
    assert torch.equal(model.model.rotary_emb.cache, torch.ones(3))


class NormWithBuffer(nn.Module):
    """A submodule with parameters and a meta non-persistent buffer."""

    def __init__(self, config, device="meta"):
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.hidden_size, device=device))
        self.register_buffer("scale", torch.ones(1, device=device), persistent=False)


def test_submodules_with_parameters_are_not_re_initialised(holder):
    h = holder(F32)
    att = wc.attach(h.socket, "daemon", checkpoint_dir=model_dir(F32))
    model = TinyLlama(load_config(F32))
    model.model.norm = NormWithBuffer(load_config(F32))
    with pytest.raises(wc.WsupError) as e:
        wc.bind_module(model, att.tensors("torch"))
    assert "model.norm (NormWithBuffer)" in str(e.value) and "256 parameter values" in str(e.value)
    report = wc.bind_module(model, att.tensors("torch"),
                            materialize={"model.norm": lambda mod, dev: {"scale": torch.full((1,), 2.0)}})
    assert "model.norm.scale" in report.materialized
    assert model.model.norm.weight.data_ptr() == att.data_ptr("model.norm.weight")
    assert float(model.model.norm.scale) == 2.0
