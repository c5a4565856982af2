"""attach() and Attachment: the holder's weights as numpy arrays or torch
tensors that point into the mapped arena.

Ownership: an Attachment owns one handle of the C ABI (wsup_attachment*).
Every array or tensor made from it holds that handle too (a numpy array
through its `base`, a torch tensor through its DLPack deleter), so the arena
stays mapped, and the holder's connection open, until the Attachment is
closed *and* the last array or tensor is gone. The mapping survives the
holder's death.

Thread-safety: lookups may be made from several threads; close() must not
race with them.
"""

import ctypes
import json

from . import _dlpack
from ._errors import CORRUPT, INVALID_ARGUMENT, NOT_FOUND, OK, UnknownTensorError, WsupError
from ._lib import load_library

MODES = ("daemon", "client", "off")
BACKENDS = ("host", "cuda")

# safetensors dtype -> (numpy typestr, DLPack (code, bits), torch dtype name
# to view the exported tensor as, or None). The numpy types of BF16 and F8_*
# are the raw bits (uint16 / uint8): numpy has no such dtypes. The torch
# export of F8_* and BOOL is uint8, viewed as the real dtype, since not every
# DLPack consumer knows float8 or bool codes.
DTYPES = {
    "F64": ("<f8", (_dlpack.KDL_FLOAT, 64), None),
    "F32": ("<f4", (_dlpack.KDL_FLOAT, 32), None),
    "F16": ("<f2", (_dlpack.KDL_FLOAT, 16), None),
    "BF16": ("<u2", (_dlpack.KDL_BFLOAT, 16), None),
    "F8_E4M3": ("|u1", (_dlpack.KDL_UINT, 8), "float8_e4m3fn"),
    "F8_E5M2": ("|u1", (_dlpack.KDL_UINT, 8), "float8_e5m2"),
    "I64": ("<i8", (_dlpack.KDL_INT, 64), None),
    "I32": ("<i4", (_dlpack.KDL_INT, 32), None),
    "I16": ("<i2", (_dlpack.KDL_INT, 16), None),
    "I8": ("|i1", (_dlpack.KDL_INT, 8), None),
    "U64": ("<u8", (_dlpack.KDL_UINT, 64), None),
    "U32": ("<u4", (_dlpack.KDL_UINT, 32), None),
    "U16": ("<u2", (_dlpack.KDL_UINT, 16), None),
    "U8": ("|u1", (_dlpack.KDL_UINT, 8), None),
    "BOOL": ("|b1", (_dlpack.KDL_UINT, 8), "bool"),
}


def _b(s):
    return None if s is None else s.encode("utf-8")


def _s(b):
    return "" if b is None else b.decode("utf-8", "replace")


class _Handle:
    """Owns one wsup_attachment*; detaches when the last reference goes."""

    __slots__ = ("lib", "ptr", "__weakref__")

    def __init__(self, lib, ptr):
        self.lib = lib
        self.ptr = ptr

    def __del__(self):
        ptr, self.ptr = self.ptr, None
        if ptr:
            self.lib.wsup_detach(ptr)


class _HostBuffer:
    """The `base` of a numpy array over host arena memory: exposes the
    memory read-only through __array_interface__ and keeps the handle."""

    __slots__ = ("handle", "__array_interface__")

    def __init__(self, handle, data_ptr, typestr, shape):
        self.handle = handle
        self.__array_interface__ = {
            "version": 3,
            "data": (data_ptr, True),  # read-only: the arena is shared and sealed
            "typestr": typestr,
            "shape": tuple(shape),
            "strides": None,
        }


class TensorInfo:
    """One manifest entry: name, dtype ("F32", "BF16", "F8_E4M3", ...),
    shape (a tuple, the local per-rank shape), nbytes and data_ptr (a host
    address, or a CUDA device address when the arena is on a GPU)."""

    __slots__ = ("name", "dtype", "shape", "nbytes", "data_ptr")

    def __init__(self, name, dtype, shape, nbytes, data_ptr):
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.nbytes = nbytes
        self.data_ptr = data_ptr

    def __repr__(self):
        return "TensorInfo(%r, %s, %s, %d bytes)" % (self.name, self.dtype, list(self.shape), self.nbytes)


class Attachment:
    """The outcome of attach(): either the holder's weights (from_holder is
    True) or a decision to load from disk, with the reason and the differing
    fingerprint fields. See attach()."""

    def __init__(self, handle, mode, device):
        lib = handle.lib
        p = handle.ptr
        self._handle = handle
        self.mode = mode
        self.from_holder = bool(lib.wsup_from_holder(p))
        self.source = _s(lib.wsup_source(p))
        self.reason = _s(lib.wsup_reason(p))
        self.diffs = json.loads(_s(lib.wsup_diffs_json(p)) or "[]")
        self.attach_ms = float(lib.wsup_attach_ms(p))
        self.holder_fingerprint = json.loads(_s(lib.wsup_holder_fingerprint_json(p)) or "{}")
        self.is_cuda = bool(lib.wsup_is_cuda(p))
        self.device = device if self.is_cuda else None
        self._infos = None
        self._span = None

    # ------------------------------------------------------------ lifetime

    def close(self):
        """Gives up this object's hold on the mapping. Arrays and tensors
        already made keep it mapped until they are gone; nothing new can be
        made from this Attachment afterwards."""
        self._handle = None

    @property
    def closed(self):
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _live(self):
        h = self._handle
        if h is None:
            raise WsupError("this attachment was closed; attach again to make new tensors", INVALID_ARGUMENT)
        if not self.from_holder:
            raise WsupError(
                "no weights from the holder (mode %s): %s; load the weights from disk" % (self.mode, self.reason),
                NOT_FOUND)
        return h

    # ------------------------------------------------------------ manifest

    def _manifest(self):
        """name -> TensorInfo for every tensor, read once in one pass."""
        h = self._live()
        if self._infos is not None:
            return self._infos
        lib, p = h.lib, ctypes.c_void_p(h.ptr)
        name_at, dtype_of, ndim_of, dim_of = (lib.wsup_tensor_name, lib.wsup_tensor_dtype, lib.wsup_tensor_ndim,
                                              lib.wsup_tensor_dim)
        data_of, nbytes_of = lib.wsup_tensor_data, lib.wsup_tensor_nbytes
        infos = {}
        for i in range(lib.wsup_num_tensors(p)):
            bname = name_at(p, i)
            dtype = dtype_of(p, bname).decode()
            shape = tuple(dim_of(p, bname, d) for d in range(ndim_of(p, bname)))
            entry = DTYPES.get(dtype)
            if entry is not None:
                nbytes = int(entry[0][2:])  # the typestr's item size
                for d in shape:
                    nbytes *= d
            else:
                nbytes = int(nbytes_of(p, bname))
            name = bname.decode("utf-8", "replace")
            infos[name] = TensorInfo(name, dtype, shape, nbytes, data_of(p, bname) or 0)
        self._infos = infos
        return infos

    def names(self):
        """Tensor names in manifest order."""
        return list(self._manifest())

    def __len__(self):
        return len(self._manifest()) if self.from_holder and not self.closed else 0

    def __contains__(self, name):
        return self.from_holder and not self.closed and name in self._manifest()

    def info(self, name):
        """The TensorInfo of `name`; UnknownTensorError (a KeyError) naming
        the fix when absent."""
        infos = self._manifest()
        got = infos.get(name)
        if got is None:
            raise UnknownTensorError(self._unknown(name, infos))
        return got

    @staticmethod
    def _unknown(name, infos):
        import difflib
        names = list(infos)
        close = difflib.get_close_matches(str(name), names, n=3, cutoff=0.8)
        hint = ("; close names: " + ", ".join(close)) if close else ("; e.g. " + ", ".join(names[:3]))
        return ("tensor %r is not in the holder's manifest (%d tensors)%s; ask for a name from "
                "Attachment.names()" % (name, len(names), hint))

    def data_ptr(self, name):
        """The tensor's address as the C library reports it (wsup_tensor_data)."""
        return self.info(name).data_ptr

    # ------------------------------------------------------------ tensors

    def numpy(self, name):
        """A read-only numpy array over the tensor's memory in the arena (no
        copy). Host arenas only. BF16 comes as uint16 and F8_* as uint8 (raw
        bits; see wsup_client.to_float32 for a converted copy)."""
        if self.is_cuda:
            self._live()
            raise WsupError("tensor %r lives in GPU memory: use Attachment.torch() (or copy_to_host() for a "
                            "host copy)" % name, INVALID_ARGUMENT)
        inf = self.info(name)
        typestr = self._dtype_entry(inf)[0]
        if inf.nbytes == 0:  # nothing to share
            import numpy as np
            return np.empty(inf.shape, dtype=np.dtype(typestr))
        span, lo = self._host_span()
        off = inf.data_ptr - lo
        return span[off:off + inf.nbytes].view(typestr).reshape(inf.shape)

    def _host_span(self):
        """One read-only uint8 array from the lowest to the highest tensor
        byte; each tensor's array is a slice of it (a view: slicing is
        cheaper than one __array_interface__ object per tensor). Only the
        tensors' own bytes are ever read through it."""
        if self._span is None:
            import numpy as np
            h = self._live()
            infos = [i for i in self._manifest().values() if i.nbytes > 0]
            lo = min((i.data_ptr for i in infos), default=0)
            hi = max((i.data_ptr + i.nbytes for i in infos), default=0)
            self._span = (np.asarray(_HostBuffer(h, lo, "|u1", (hi - lo,))), lo)
        return self._span

    def torch(self, name):
        """A torch tensor over the tensor's memory (no copy): on cuda:DEVICE
        for a cuda arena, on the CPU for a host arena. Dtypes map one to one
        (BF16 -> bfloat16, F8_E4M3 -> float8_e4m3fn, ...). Treat it as
        read-only: a host arena is mapped read-only (a write faults), and a
        write to a cuda arena changes the weights of every engine."""
        return self._torch_many([name])[name]

    def _torch_many(self, names):
        h = self._live()
        import torch
        from torch.utils import dlpack as tdl
        infos = [self.info(n) for n in names]
        items, views = [], []
        for inf in infos:
            _, (code, bits), view_as = self._dtype_entry(inf)
            items.append((inf.data_ptr, inf.shape, code, bits))
            target = None
            if view_as is not None:
                target = getattr(torch, view_as, None)
                if target is None:
                    raise WsupError("tensor %r is %s but this torch (%s) has no torch.%s; use a newer torch" %
                                    (inf.name, inf.dtype, torch.__version__, view_as), INVALID_ARGUMENT)
            views.append(target)
        if self.is_cuda:
            dev_type, dev_id = _dlpack.KDL_CUDA, self.device
        else:
            dev_type, dev_id = _dlpack.KDL_CPU, 0
        capsules = _dlpack.make_capsules(h, items, dev_type, dev_id)
        out = {}
        from_dlpack = tdl.from_dlpack
        for inf, capsule, target in zip(infos, capsules, views):
            t = from_dlpack(capsule)
            out[inf.name] = t if target is None else t.view(target)
        return out

    def dlpack(self, name):
        """An object with __dlpack__ / __dlpack_device__ over the tensor (no
        copy), for any DLPack consumer. F8_* and BOOL are exported as uint8."""
        h = self._live()
        inf = self.info(name)
        _, (code, bits), _ = self._dtype_entry(inf)
        if self.is_cuda:
            return _dlpack.Exported(h, inf.data_ptr, inf.shape, code, bits, _dlpack.KDL_CUDA, self.device)
        return _dlpack.Exported(h, inf.data_ptr, inf.shape, code, bits, _dlpack.KDL_CPU, 0)

    def tensors(self, kind=None):
        """Every tensor, as a dict name -> tensor, in manifest order.

        kind: "numpy" (host arenas only) or "torch"; default numpy for a host
        arena and torch for a cuda arena."""
        if kind is None:
            kind = "torch" if self.is_cuda else "numpy"
        if kind == "numpy":
            return {n: self.numpy(n) for n in self.names()}
        if kind == "torch":
            return self._torch_many(self.names())
        raise WsupError("kind %r is not one of numpy, torch" % (kind,), INVALID_ARGUMENT)

    def copy_to_host(self, name):
        """A copy of the tensor's bytes in host memory, as a writable numpy
        array (raw bits for BF16 / F8_*); works for host and cuda arenas."""
        h = self._live()
        import numpy as np
        inf = self.info(name)
        out = np.empty(inf.shape, dtype=np.dtype(self._dtype_entry(inf)[0]))
        rc = h.lib.wsup_tensor_copy_to_host(h.ptr, _b(name), out.ctypes.data_as(ctypes.c_void_p), out.nbytes)
        if rc != OK:
            raise WsupError("cannot copy tensor %r to host memory (status %d)" % (name, rc), rc)
        return out

    def _dtype_entry(self, inf):
        got = DTYPES.get(inf.dtype)
        if got is None:
            raise WsupError("tensor %r has dtype %s, which this package does not know; update wsup_client" %
                            (inf.name, inf.dtype), CORRUPT)
        return got

    def __repr__(self):
        if not self.from_holder:
            return "Attachment(source=disk, mode=%s, reason=%r)" % (self.mode, self.reason)
        return "Attachment(source=holder, %d tensors, %s, %.1f ms)" % (
            len(self), "cuda:%d" % self.device if self.is_cuda else "host", self.attach_ms)


def attach(socket_path, mode="daemon", *, checkpoint_dir=None, fingerprint=None, backend="host", device=0,
           client_name="engine", timeout_ms=10000, tp_size=1, tp_rank=0, pp_size=1, pp_rank=0, dp_size=1,
           ep_size=1, ep_rank=0, revision="", library=None):
    """Connects to the holder at socket_path and attaches in `mode`.

    The modes are those of the C++ client (client/client.h):
      daemon: the holder must serve these weights; a missing holder or a
              fingerprint mismatch raises WsupError (code UNAVAILABLE, IO or
              MISMATCH; the message lists the differing fields).
      client: use the holder when it has exactly these weights; otherwise the
              returned Attachment has from_holder False, `reason` says why and
              `diffs` lists the differing fields ({field, ours, holder}): load
              from disk and record the miss.
      off:    never attach (reason "mode off").

    The fingerprint is either checkpoint_dir (its headers and config are read,
    not its tensors, and the fingerprint computed as the holder computes it,
    with backend, device, tp_*, pp_*, dp_size, ep_* and revision) or
    `fingerprint` (a dict or JSON text of string fields, as the holder sends).
    Exactly one must be given, except in mode off.

    library: path of libwsup_client.so (default: see wsup_client.load_library).
    Misuse (a bad mode, both or neither fingerprint) raises WsupError with
    code INVALID_ARGUMENT.
    """
    _, lib = load_library(library)
    if fingerprint is not None and not isinstance(fingerprint, str):
        fingerprint = json.dumps(fingerprint)
    opts = {"client_name": client_name, "timeout_ms": int(timeout_ms), "device": int(device)}
    if checkpoint_dir is not None:
        opts.update(backend=backend, tp_size=int(tp_size), tp_rank=int(tp_rank), pp_size=int(pp_size),
                    pp_rank=int(pp_rank), dp_size=int(dp_size), ep_size=int(ep_size), ep_rank=int(ep_rank),
                    revision=revision)
    ptr = lib.wsup_attach(_b(socket_path), _b(mode), _b(fingerprint),
                          _b(None if checkpoint_dir is None else str(checkpoint_dir)), _b(json.dumps(opts)))
    if not ptr:
        raise MemoryError("wsup_attach: out of memory")
    handle = _Handle(lib, ptr)
    status = lib.wsup_status(ptr)
    if status != OK:
        message = _s(lib.wsup_error(ptr))
        del handle  # detaches
        raise WsupError(message, status)
    return Attachment(handle, mode, int(device))


def library_version(library=None):
    """The loaded libwsup_client.so's version, "major.minor.patch"."""
    _, lib = load_library(library)
    return _s(lib.wsup_client_version())
