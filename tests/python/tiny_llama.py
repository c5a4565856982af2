"""A small Llama in plain torch with the Hugging Face module layout (and so
the checkpoint's tensor names), for checks that need torch but not
transformers: tests/python/test_torch_host.py, and gpu_torch_check.py
--impl tiny. Every constructor takes `device`, so the model can be built on
the meta device with torch 1.x as well. Greedy decoding recomputes the whole
sequence each step (no KV cache): the test models are tiny.
"""

import json
import math
import types

import torch
from torch import nn


def read_config(path, **overrides):
    """config.json as an object with attributes, rope_theta read from either
    layout (rope_parameters, or the older top-level key)."""
    with open(path) as f:
        c = json.load(f)
    rope = c.get("rope_parameters") or {}
    c["rope_theta"] = rope.get("rope_theta", c.get("rope_theta", 10000.0))
    c.update(overrides)
    return types.SimpleNamespace(**c)


class RMSNorm(nn.Module):
    def __init__(self, n, eps, device):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, device=device))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Rotary(nn.Module):
    def __init__(self, config, device=None):
        super().__init__()
        self.config = config
        hd = config.head_dim
        inv = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64, device=device).float() / hd))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, t):
        f = torch.outer(torch.arange(t, dtype=torch.float32, device=self.inv_freq.device), self.inv_freq)
        e = torch.cat((f, f), -1)
        return e.cos(), e.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), -1)


class Attention(nn.Module):
    def __init__(self, c, device):
        super().__init__()
        self.nh, self.nkv, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        lin = lambda i, o: nn.Linear(i, o, bias=False, device=device)  # noqa: E731
        self.q_proj = lin(c.hidden_size, self.nh * self.hd)
        self.k_proj = lin(c.hidden_size, self.nkv * self.hd)
        self.v_proj = lin(c.hidden_size, self.nkv * self.hd)
        self.o_proj = lin(self.nh * self.hd, c.hidden_size)

    def forward(self, x, cos, sin):
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.nh, self.hd).transpose(0, 1)
        k = self.k_proj(x).view(t, self.nkv, self.hd).transpose(0, 1)
        v = self.v_proj(x).view(t, self.nkv, self.hd).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(self.nh // self.nkv, 0)
        v = v.repeat_interleave(self.nh // self.nkv, 0)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        return self.o_proj((s.softmax(-1) @ v).transpose(0, 1).reshape(t, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, c, device):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False, device=device)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False, device=device)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False, device=device)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c, device):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, device)
        self.self_attn = Attention(c, device)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, device)
        self.mlp = MLP(c, device)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self, c, device):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, device=device)
        self.layers = nn.ModuleList(Layer(c, device) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, device)
        self.rotary_emb = Rotary(c, device=device)


class TinyLlama(nn.Module):
    def __init__(self, c, device="meta"):
        super().__init__()
        self.model = Model(c, device)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False, device=device)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids):
        x = self.model.embed_tokens(ids)
        cos, sin = self.model.rotary_emb(ids.shape[0])
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))

    @torch.no_grad()
    def greedy(self, prompt, n):
        ids = list(prompt)
        for _ in range(n):
            ids.append(int(self(torch.tensor(ids, device=self.lm_head.weight.device)).argmax(-1)[-1]))
        return ids[len(prompt):]
