"""Conversions an engine may need after attaching. Every function here makes
a copy: the attached tensors themselves are never changed.

numpy has no bfloat16 or float8 dtypes, so Attachment.numpy() hands out their
raw bits (BF16 as uint16, F8_E4M3 / F8_E5M2 as uint8); to_float32() decodes
them. Block FP8 checkpoints (DeepSeek-V3 style: an F8_E4M3 `X.weight` and a
float32 `X.weight_scale_inv` holding one scale per block of 128x128) are
turned into plain weights by dequantize_block_fp8() / dequantize_checkpoint(),
for numpy arrays and torch tensors alike: weight = fp8 value x its block's
scale, edge blocks partial.
"""

_E4M3_TABLE = None
_E5M2_TABLE = None


def _fp8_table(kind):
    """The 256 float32 values of an FP8 format, by bit pattern."""
    import numpy as np
    global _E4M3_TABLE, _E5M2_TABLE
    if kind == "F8_E4M3" and _E4M3_TABLE is not None:
        return _E4M3_TABLE
    if kind == "F8_E5M2" and _E5M2_TABLE is not None:
        return _E5M2_TABLE
    ebits, mbits = (4, 3) if kind == "F8_E4M3" else (5, 2)
    bias = (1 << (ebits - 1)) - 1
    out = np.empty(256, dtype=np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e = (b >> mbits) & ((1 << ebits) - 1)
        m = b & ((1 << mbits) - 1)
        if kind == "F8_E4M3" and e == 15 and m == 7:
            v = float("nan")  # e4m3fn: no infinities, one NaN pattern per sign
        elif kind == "F8_E5M2" and e == 31:
            v = float("inf") if m == 0 else float("nan")
        elif e == 0:
            v = (m / (1 << mbits)) * 2.0 ** (1 - bias)
        else:
            v = (1 + m / (1 << mbits)) * 2.0 ** (e - bias)
        out[b] = sign * v
    out.setflags(write=False)
    if kind == "F8_E4M3":
        _E4M3_TABLE = out
    else:
        _E5M2_TABLE = out
    return out


def to_float32(array, dtype):
    """A float32 copy of a numpy array of raw `dtype` bits ("BF16" as uint16,
    "F8_E4M3" / "F8_E5M2" as uint8), or of any numeric array."""
    import numpy as np
    a = np.asarray(array)
    if dtype == "BF16":
        if a.dtype != np.uint16:
            raise TypeError("BF16 bits must come as uint16, got %s" % a.dtype)
        return (a.astype(np.uint32) << 16).view(np.float32)
    if dtype in ("F8_E4M3", "F8_E5M2"):
        if a.dtype != np.uint8:
            raise TypeError("%s bits must come as uint8, got %s" % (dtype, a.dtype))
        return _fp8_table(dtype)[a]
    return a.astype(np.float32)


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def dequantize_block_fp8(weight, scale_inv, block_size=(128, 128), dtype=None):
    """weight x scale_inv, broadcast over blocks of block_size: a new tensor.

    weight: [M, N] F8_E4M3 (a torch float8_e4m3fn tensor, or a numpy uint8
    array of its bits); scale_inv: [ceil(M/bm), ceil(N/bn)] float32.
    dtype: the result's dtype (torch: default float32; numpy: always float32).
    """
    bm, bn = int(block_size[0]), int(block_size[1])
    if len(weight.shape) != 2 or len(scale_inv.shape) != 2:
        raise ValueError("block FP8 needs a 2-D weight and a 2-D scale_inv, got %s and %s" %
                         (tuple(weight.shape), tuple(scale_inv.shape)))
    m, n = int(weight.shape[0]), int(weight.shape[1])
    want = ((m + bm - 1) // bm, (n + bn - 1) // bn)
    if tuple(int(d) for d in scale_inv.shape) != want:
        raise ValueError("scale_inv has shape %s; a [%d, %d] weight in %dx%d blocks needs %s" %
                         (tuple(scale_inv.shape), m, n, bm, bn, want))
    if _is_torch(weight):
        import torch
        s = scale_inv.to(torch.float32)
        s = s.repeat_interleave(bm, dim=0)[:m].repeat_interleave(bn, dim=1)[:, :n]
        out = weight.to(torch.float32) * s
        return out if dtype is None else out.to(dtype)
    import numpy as np
    w = to_float32(weight, "F8_E4M3")
    s = np.repeat(np.repeat(np.asarray(scale_inv, dtype=np.float32), bm, axis=0)[:m], bn, axis=1)[:, :n]
    return w * s


def dequantize_checkpoint(tensors, block_size=(128, 128), dtype=None, suffix="_scale_inv"):
    """A new dict where every `X.weight` with an `X.weight_scale_inv` beside it
    is block-dequantized and the scales are gone. Other tensors are passed
    through as they are (the same objects, no copy) unless `dtype` is given
    (a torch dtype), in which case tensors of another floating dtype are
    converted (a copy).

    This is what a torch engine without block-FP8 kernels must do with such a
    checkpoint; it costs a full-precision copy of every quantized weight.
    """
    out = {}
    for name, t in tensors.items():
        if name.endswith(suffix) and name[: -len(suffix)] in tensors:
            continue
        scale = tensors.get(name + suffix)
        if scale is not None:
            out[name] = dequantize_block_fp8(t, scale, block_size, dtype)
        elif dtype is not None and _is_torch(t) and t.is_floating_point() and t.dtype != dtype:
            out[name] = t.to(dtype)
        else:
            out[name] = t
    return out
