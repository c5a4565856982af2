"""attach() and Attachment: the holder's weights as numpy arrays or torch
tensors that point into the mapped arena.

Ownership: an Attachment owns one handle of the C ABI (wsup_attachment*).
Every array or tensor made from it holds that handle too (a numpy array
through its `base`, a torch tensor through its DLPack deleter), so the arena
stays mapped, and the holder's connection open, until the Attachment is
closed *and* the last array or tensor is gone. The mapping survives the
holder's death.

The manifest (every tensor's name, dtype, shape, size and address) is read
once per Attachment, with one call: wsup_manifest_table's block, decoded
into columns with memoryview casts and list slices (no numpy, so a torch
engine without numpy works). TensorInfo objects are made only for the names
asked about; tensors() reads the columns directly.

Thread-safety: lookups may be made from several threads; close() must not
race with them.
"""

import ctypes
import json
import operator
import struct

from . import _dlpack
from ._errors import CORRUPT, INTERNAL, INVALID_ARGUMENT, NOT_FOUND, OK, UnknownTensorError, WsupError
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


# How an Attachment reads the manifest: "table" (wsup_manifest_table, one
# call) or "per-tensor" (wsup_tensor_name, _dtype, _ndim, _dim, _data and
# _nbytes for each tensor, as before the table existed). Private: the
# benchmark (bench/attach_python.py) and the tests set it to compare the two.
_MANIFEST_READER = "table"

# wsup_manifest_header of client/wsup_client.h, version 1.
_TABLE_HEADER = struct.Struct("=8sIIIIQQQQQ")
_TABLE_MAGIC = b"wsupMTAB"
_TABLE_STRIDED = 1
_TABLE_DIMS_UNIQUE = 2  # one dims index per distinct shape and strides
_RECORD_FIELDS = 8  # u64 each: data, nbytes, name offset, name bytes, dtype offset, dtype bytes, ndim, dims index

_api = ctypes.pythonapi
_api.PyMemoryView_FromMemory.restype = ctypes.py_object
_api.PyMemoryView_FromMemory.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int]
_PYBUF_READ = 0x100


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
    address, or a CUDA device address when the arena is on a GPU), and
    strides: None for a contiguous row-major tensor, else a tuple of
    strides in elements (an engine-made layout may store a tensor
    transposed or padded)."""

    __slots__ = ("name", "dtype", "shape", "nbytes", "data_ptr", "strides")

    def __init__(self, name, dtype, shape, nbytes, data_ptr, strides=None):
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.nbytes = nbytes
        self.data_ptr = data_ptr
        self.strides = strides

    def __repr__(self):
        return "TensorInfo(%r, %s, %s, %d bytes)" % (self.name, self.dtype, list(self.shape), self.nbytes)


class _Manifest:
    """Every tensor's description as columns in manifest order: names,
    dtypes, shapes (tuples), nbytes and data (addresses), plus index (name ->
    position). TensorInfo objects are made on first request and kept."""

    __slots__ = ("names", "dtypes", "shapes", "nbytes", "data", "strides", "_index", "_infos")

    def __init__(self, names, dtypes, shapes, nbytes, data, strides=None):
        # data and nbytes are sequences of ints: lists, or (from the manifest
        # table) memoryviews of format "Q" that index, iterate and zip alike.
        self.names = names
        self.dtypes = dtypes
        self.shapes = shapes
        self.nbytes = nbytes
        self.data = data
        # None for each contiguous row-major tensor, else its strides in
        # elements (an engine-made layout may hold a view, e.g. transposed);
        # a manifest with no strided tensor keeps None for the whole column.
        self.strides = strides
        self._index = None
        self._infos = {}

    @property
    def index(self):
        """name -> position, made on the first lookup by name (walking every
        tensor needs none)."""
        if self._index is None:
            self._index = dict(zip(self.names, range(len(self.names))))
        return self._index

    def info(self, name):
        """The TensorInfo of `name`, or None."""
        got = self._infos.get(name)
        if got is None:
            i = self.index.get(name)
            if i is None:
                return None
            got = self._infos[name] = TensorInfo(name, self.dtypes[i], self.shapes[i], self.nbytes[i],
                                                 self.data[i], self.strides[i] if self.strides else None)
        return got


def _dense_nbytes(dtypes, shapes, nbytes, strides=None):
    """TensorInfo.nbytes: item size x elements for a contiguous tensor of a
    dtype this package knows; the holder's nbytes (the span its strides
    cover, which a strided view needs whole) for the others."""
    out = []
    for i, (dtype, shape, nb) in enumerate(zip(dtypes, shapes, nbytes)):
        entry = DTYPES.get(dtype)
        if entry is not None and (strides is None or strides[i] is None):
            nb = int(entry[0][2:])  # the typestr's item size
            for d in shape:
                nb *= d
        out.append(nb)
    return out


def _read_per_tensor(lib, p):
    """The manifest through the per-tensor calls (six per tensor)."""
    name_at, dtype_of, ndim_of, dim_of = (lib.wsup_tensor_name, lib.wsup_tensor_dtype, lib.wsup_tensor_ndim,
                                          lib.wsup_tensor_dim)
    data_of, nbytes_of, stride_of = lib.wsup_tensor_data, lib.wsup_tensor_nbytes, lib.wsup_tensor_stride
    names, dtypes, shapes, sizes, data, strides = [], [], [], [], [], []
    for i in range(lib.wsup_num_tensors(p)):
        bname = name_at(p, i)
        dtype = dtype_of(p, bname).decode()
        shape = tuple(dim_of(p, bname, d) for d in range(ndim_of(p, bname)))
        names.append(bname.decode("utf-8", "replace"))
        dtypes.append(dtype)
        shapes.append(shape)
        st = tuple(stride_of(p, bname, d) for d in range(len(shape)))
        st = None if st == _contiguous(shape) else st
        strides.append(st)
        sizes.append(int(nbytes_of(p, bname)) if dtype not in DTYPES or st is not None else 0)
        data.append(data_of(p, bname) or 0)
    if not any(x is not None for x in strides):
        strides = None
    return _Manifest(names, dtypes, shapes, _dense_nbytes(dtypes, shapes, sizes, strides), data, strides)


def _bad_table(what):
    return WsupError("the manifest table of libwsup_client.so is not what this package reads (%s); the library "
                     "and the wsup_client package come from different wsup versions: use the library built "
                     "with this package (or point $WSUP_CLIENT_LIB at it)" % what, CORRUPT)


def _read_table(lib, p):
    """The manifest from wsup_manifest_table's block (client/wsup_client.h),
    read in place: the columns come out of memoryview casts and strided
    slices, the names out of one split, and a shape tuple or dtype string is
    made once per distinct one (the block shares them), so the cost per
    tensor is little more than its name and its address."""
    size = ctypes.c_size_t()
    ptr = lib.wsup_manifest_table(p, ctypes.byref(size))
    if not ptr:
        raise WsupError("wsup_manifest_table returned no manifest for an attached handle: out of memory",
                        INTERNAL)
    total = size.value
    if total < _TABLE_HEADER.size:
        raise _bad_table("%d bytes, less than a header" % total)
    # A view of the library's block, valid while the handle is (the caller
    # holds it); nothing made from it keeps it.
    mv = _api.PyMemoryView_FromMemory(ptr, total, _PYBUF_READ)
    (magic, version, header_bytes, record_bytes, flags, count, dims_offset, strings_offset, strings_bytes,
     total_bytes) = _TABLE_HEADER.unpack_from(mv, 0)
    if magic != _TABLE_MAGIC or version != 1:
        raise _bad_table("magic %r, version %d; this package reads version 1" % (magic, version))
    k = record_bytes // 8
    records_end = header_bytes + count * record_bytes
    if (total_bytes != total or header_bytes < _TABLE_HEADER.size or header_bytes % 8 or record_bytes % 8 or
            k < _RECORD_FIELDS or records_end > dims_offset or dims_offset % 8 or dims_offset > strings_offset or
            strings_offset + strings_bytes > total or count != lib.wsup_num_tensors(p)):
        raise _bad_table("bounds: %d bytes, header %d, records %d x %d, dims at %d, strings at %d (%d bytes)" %
                         (total, header_bytes, count, record_bytes, dims_offset, strings_offset, strings_bytes))
    if count == 0:
        return _Manifest([], [], [], [], [])
    records = mv[header_bytes:records_end].cast("Q")
    # The address and size columns are copied out of the library's block
    # (tobytes of a strided view: one C loop each) and kept as memoryviews
    # of the copies: indexing one makes its int on demand, where a list
    # would make (and a fresh process fault in) 40,000 int objects now.
    data = memoryview(records[0::k].tobytes()).cast("Q")
    nbytes = memoryview(records[1::k].tobytes()).cast("Q")
    names_at = records[2]  # the names follow the distinct dtypes
    # Walked once or twice below, never kept.
    dtype_offsets = records[4::k].tolist()
    ndims = records[6::k]
    dims_index = records[7::k].tolist()
    if names_at > strings_bytes:
        raise _bad_table("the first name at %d, past the %d string bytes" % (names_at, strings_bytes))
    strings = mv[strings_offset:strings_offset + strings_bytes]
    # name, name, ..., "" (each name ends with a NUL; names hold none).
    names = str(strings[names_at:], "utf-8", "replace").split("\0")
    if len(names) != count + 1 or names[-1]:
        raise _bad_table("%d names for %d tensors" % (len(names) - 1, count))
    names.pop()
    dtype_at, at = {}, 0
    for spelling in str(strings[:names_at], "utf-8", "replace").split("\0")[:-1]:
        dtype_at[at] = spelling
        at += len(spelling.encode("utf-8")) + 1
    dims = mv[dims_offset:strings_offset].cast("q")
    # Keyed by (offset, rank): a scalar's empty dims start where the next
    # distinct shape's do, so the offset alone does not name one.
    # The (offset, rank) pairs are walked twice through zip and never kept as
    # a list: zip reuses its tuple once the lookup drops it, so only the
    # distinct shapes allocate one (a list of 20,000 pairs cost more than
    # the rest of the read).
    # With _TABLE_DIMS_UNIQUE (what this package's library writes) the dims
    # index alone names a shape: its rank comes from dict(zip(...)), a C loop
    # that reuses one pair throughout. Otherwise (an older library, where a
    # scalar's index may be the next shape's) the key is (index, rank).
    unique = bool(flags & _TABLE_DIMS_UNIQUE)
    if unique:
        distinct = dict(zip(dims_index, ndims)).items()
    else:
        distinct = set(zip(dims_index, ndims))
    shape_at, stride_at = {}, {}
    for o, n in distinct:  # one entry per distinct shape
        if o + 2 * n > len(dims):
            raise _bad_table("dims at %d + 2 x %d, past the %d dims" % (o, n, len(dims)))
        key = o if unique else (o, n)
        shape_at[key] = shape = tuple(dims[o:o + n].tolist())
        if flags & _TABLE_STRIDED:
            st = tuple(dims[o + n:o + 2 * n].tolist())
            stride_at[key] = None if st == _contiguous(shape) else st
    try:
        dtypes = list(map(dtype_at.__getitem__, dtype_offsets))
    except KeyError as e:
        raise _bad_table("a dtype at offset %s, where none starts" % e) from None
    keys = dims_index if unique else list(zip(dims_index, ndims))
    shapes = list(map(shape_at.__getitem__, keys))
    strides = None
    if flags & _TABLE_STRIDED:
        strides = list(map(stride_at.__getitem__, keys))
        if not any(x is not None for x in strides):
            strides = None
        nbytes = _dense_nbytes(dtypes, shapes, nbytes, strides)
    return _Manifest(names, dtypes, shapes, nbytes, data, strides)


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
        self._infos = None
        self._span = None  # its buffer holds the handle too

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
        """The _Manifest of every tensor, read once."""
        h = self._live()
        m = self._infos
        if m is None:
            p = ctypes.c_void_p(h.ptr)
            if _MANIFEST_READER == "per-tensor":
                m = _read_per_tensor(h.lib, p)
            else:
                m = _read_table(h.lib, p)
            self._infos = m
        return m

    def names(self):
        """Tensor names in manifest order."""
        return list(self._manifest().names)

    def __len__(self):
        return len(self._manifest().names) if self.from_holder and not self.closed else 0

    def __contains__(self, name):
        return self.from_holder and not self.closed and name in self._manifest().index

    def info(self, name):
        """The TensorInfo of `name`; UnknownTensorError (a KeyError) naming
        the fix when absent."""
        m = self._manifest()
        got = m.info(name)
        if got is None:
            raise UnknownTensorError(self._unknown(name, m.names))
        return got

    def _index(self, m, name):
        i = m.index.get(name)
        if i is None:
            raise UnknownTensorError(self._unknown(name, m.names))
        return i

    @staticmethod
    def _unknown(name, names):
        import difflib
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
        m = self._manifest()
        return self._numpy_at(m, [self._index(m, name)])[name]

    def _numpy_at(self, m, indices=None):
        """name -> numpy array for the manifest entries at `indices` (None:
        every entry, walked column by column)."""
        import numpy as np
        cols = (m.names, m.dtypes, m.shapes, m.nbytes, m.data, m.strides or [None] * len(m.names))
        rows = zip(*cols) if indices is None else ([c[i] for c in cols] for i in indices)
        span = lo = None
        ndarray = np.ndarray
        dtypes = {}  # safetensors dtype -> numpy dtype, looked up once each
        out = {}
        for name, dt, shape, nbytes, ptr, strides in rows:
            npdt = dtypes.get(dt)
            if npdt is None:
                npdt = dtypes[dt] = np.dtype(self._dtype_of(name, dt)[0])
            if nbytes == 0:  # nothing to share
                out[name] = np.empty(shape, dtype=npdt)
            else:
                if span is None:
                    span, lo = self._host_span()
                # A read-only view into the span (its base), at the tensor's
                # offset, with its strides (in bytes for numpy) if it has any.
                out[name] = ndarray(shape, npdt, span, ptr - lo,
                                    None if strides is None else [d * npdt.itemsize for d in strides])
        return out

    def _host_span(self):
        """One read-only uint8 array from the lowest to the highest tensor
        byte; each tensor's array is a view into it (one ndarray call each
        is cheaper than one __array_interface__ object per tensor). Only the
        tensors' own bytes are ever read through it."""
        if self._span is None:
            import numpy as np
            h = self._live()
            m = self._manifest()
            # Empty tensors' addresses lie inside their allocations too, so
            # they may lower `lo` but never make the span miss a tensor.
            lo = min(m.data, default=0)
            hi = max(map(operator.add, m.data, m.nbytes), default=0)
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
        m = self._manifest()
        return self._torch_at(m, [self._index(m, n) for n in names])

    def _torch_at(self, m, indices):
        """name -> torch tensor for the manifest entries at `indices`."""
        h = self._live()
        import torch
        from torch.utils import dlpack as tdl
        kinds = {}  # safetensors dtype -> (code, bits, torch dtype to view as or None)
        items, views = [], []
        names, dts, shapes, data = m.names, m.dtypes, m.shapes, m.data
        strides = m.strides or None
        for i in indices:
            dt = dts[i]
            kind = kinds.get(dt)
            if kind is None:
                _, (code, bits), view_as = self._dtype_of(names[i], dt)
                target = None
                if view_as is not None:
                    target = getattr(torch, view_as, None)
                    if target is None:
                        raise WsupError("tensor %r is %s but this torch (%s) has no torch.%s; use a newer torch" %
                                        (names[i], dt, torch.__version__, view_as), INVALID_ARGUMENT)
                kind = kinds[dt] = (code, bits, target)
            if strides is None or strides[i] is None:
                items.append((data[i], shapes[i], kind[0], kind[1]))
            else:
                items.append((data[i], shapes[i], kind[0], kind[1], strides[i]))
            views.append(kind[2])
        if self.is_cuda:
            dev_type, dev_id = _dlpack.KDL_CUDA, self.device
        else:
            dev_type, dev_id = _dlpack.KDL_CPU, 0
        capsules = _dlpack.make_capsules(h, items, dev_type, dev_id)
        out = {}
        from_dlpack = tdl.from_dlpack
        for i, capsule, target in zip(indices, capsules, views):
            t = from_dlpack(capsule)
            out[names[i]] = t if target is None else t.view(target)
        return out

    def dlpack(self, name):
        """An object with __dlpack__ / __dlpack_device__ over the tensor (no
        copy), for any DLPack consumer. F8_* and BOOL are exported as uint8."""
        h = self._live()
        inf = self.info(name)
        _, (code, bits), _ = self._dtype_entry(inf)
        if self.is_cuda:
            return _dlpack.Exported(h, inf.data_ptr, inf.shape, code, bits, _dlpack.KDL_CUDA, self.device,
                                    inf.strides)
        return _dlpack.Exported(h, inf.data_ptr, inf.shape, code, bits, _dlpack.KDL_CPU, 0, inf.strides)

    def tensors(self, kind=None):
        """Every tensor, as a dict name -> tensor, in manifest order.

        kind: "numpy" (host arenas only) or "torch"; default numpy for a host
        arena and torch for a cuda arena."""
        if kind is None:
            kind = "torch" if self.is_cuda else "numpy"
        if kind == "numpy":
            m = self._manifest()
            if self.is_cuda and m.names:
                self.numpy(m.names[0])  # raises: the tensors are in GPU memory
            return self._numpy_at(m)
        if kind == "torch":
            m = self._manifest()
            return self._torch_at(m, range(len(m.names)))
        raise WsupError("kind %r is not one of numpy, torch" % (kind,), INVALID_ARGUMENT)

    def copy_to_host(self, name):
        """A copy of the tensor's bytes in host memory, as a writable numpy
        array (raw bits for BF16 / F8_*); works for host and cuda arenas. A
        strided tensor comes with its strides (over a copy of its span)."""
        h = self._live()
        import numpy as np
        inf = self.info(name)
        dtype = np.dtype(self._dtype_entry(inf)[0])
        if inf.strides is None:
            out = np.empty(inf.shape, dtype=dtype)
        else:
            out = np.empty(inf.nbytes // dtype.itemsize, dtype=dtype)
        rc = h.lib.wsup_tensor_copy_to_host(h.ptr, _b(name), out.ctypes.data_as(ctypes.c_void_p), out.nbytes)
        if rc != OK:
            raise WsupError("cannot copy tensor %r to host memory (status %d)" % (name, rc), rc)
        if inf.strides is None:
            return out
        return np.lib.stride_tricks.as_strided(out, shape=inf.shape, strides=[d * dtype.itemsize for d in inf.strides])

    def _dtype_entry(self, inf):
        return self._dtype_of(inf.name, inf.dtype)

    @staticmethod
    def _dtype_of(name, dtype):
        got = DTYPES.get(dtype)
        if got is None:
            raise WsupError("tensor %r has dtype %s, which this package does not know; update wsup_client" %
                            (name, dtype), CORRUPT)
        return got

    def __repr__(self):
        if not self.from_holder:
            return "Attachment(source=disk, mode=%s, reason=%r)" % (self.mode, self.reason)
        return "Attachment(source=holder, %d tensors, %s, %.1f ms)" % (
            len(self), "cuda:%d" % self.device if self.is_cuda else "host", self.attach_ms)


def _contiguous(shape):
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(out))


def engine_options(engine):
    """The C ABI's options for an engine's identity (the engine part of an
    engine-made layout's fingerprint): `engine` is a dict with name (or
    engine), version (or engine_version) and transform, or a (name, version,
    transform) tuple; None adds nothing."""
    if engine is None:
        return {}
    if isinstance(engine, (tuple, list)):
        if len(engine) not in (2, 3):
            raise WsupError("engine=%r: give (name, version) or (name, version, transform)" % (engine,),
                            INVALID_ARGUMENT)
        name, version = engine[0], engine[1]
        transform = engine[2] if len(engine) == 3 else ""
    elif isinstance(engine, dict):
        unknown = set(engine) - {"name", "engine", "version", "engine_version", "transform"}
        if unknown:
            raise WsupError("engine=: unknown keys %s; use name, version, transform" % sorted(unknown),
                            INVALID_ARGUMENT)
        name = engine.get("name", engine.get("engine"))
        version = engine.get("version", engine.get("engine_version"))
        transform = engine.get("transform", "")
    else:
        raise WsupError("engine=%r: give a dict {name, version, transform} or a tuple" % (engine,), INVALID_ARGUMENT)
    if not name or not version:
        raise WsupError("engine=: name and version are required (they are part of the layout's fingerprint)",
                        INVALID_ARGUMENT)
    return {"engine": str(name), "engine_version": str(version), "transform": str(transform or "")}


def request_options(*, checkpoint_dir, backend, device, client_name, timeout_ms, tp_size, tp_rank, pp_size,
                    pp_rank, dp_size, ep_size, ep_rank=0, revision):
    """options_json of wsup_attach and wsup_publish_begin (without the engine)."""
    opts = {"client_name": client_name, "timeout_ms": int(timeout_ms), "device": int(device)}
    if checkpoint_dir is not None:
        opts.update(backend=backend, tp_size=int(tp_size), tp_rank=int(tp_rank), pp_size=int(pp_size),
                    pp_rank=int(pp_rank), dp_size=int(dp_size), ep_size=int(ep_size), ep_rank=int(ep_rank),
                    revision=revision)
    return opts


def attach(socket_path, mode="daemon", *, checkpoint_dir=None, fingerprint=None, backend="host", device=0,
           client_name="engine", timeout_ms=10000, tp_size=1, tp_rank=0, pp_size=1, pp_rank=0, dp_size=1,
           ep_size=1, ep_rank=0, revision="", engine=None, wait_ms=0, library=None):
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

    engine: attach an engine-made layout (a holder started with --layout
    engine): the engine's identity as wsup_client.publish takes it (a dict
    {name, version, transform} or a tuple), added to the fingerprint, so
    that a reader names the layout exactly as its writer did. wait_ms: how
    long to wait for such a layout that another process is still writing
    (default 0: an error at once).

    library: path of libwsup_client.so (default: see wsup_client.load_library).
    Misuse (a bad mode, both or neither fingerprint) raises WsupError with
    code INVALID_ARGUMENT.
    """
    _, lib = load_library(library)
    if fingerprint is not None and not isinstance(fingerprint, str):
        fingerprint = json.dumps(fingerprint)
    opts = request_options(checkpoint_dir=checkpoint_dir, backend=backend, device=device, client_name=client_name,
                           timeout_ms=timeout_ms, tp_size=tp_size, tp_rank=tp_rank, pp_size=pp_size, pp_rank=pp_rank,
                           dp_size=dp_size, ep_size=ep_size, ep_rank=ep_rank,
                           revision=revision)
    opts.update(engine_options(engine))
    if wait_ms:
        opts["wait_ms"] = int(wait_ms)
    handle = open_handle(lib, "wsup_attach", socket_path, mode, fingerprint, checkpoint_dir, opts)
    return Attachment(handle, mode, int(device))


def open_handle(lib, call, socket_path, mode, fingerprint, checkpoint_dir, opts):
    """A _Handle from wsup_attach or wsup_publish_begin (`call`, which take
    the same arguments); raises WsupError with the library's message when its
    status is not OK (the handle is then detached)."""
    ptr = getattr(lib, call)(_b(socket_path), _b(mode), _b(fingerprint),
                             _b(None if checkpoint_dir is None else str(checkpoint_dir)), _b(json.dumps(opts)))
    if not ptr:
        raise MemoryError("%s: out of memory" % call)
    handle = _Handle(lib, ptr)
    status = lib.wsup_status(ptr)
    if status != OK:
        message = _s(lib.wsup_error(ptr))
        del handle  # detaches
        raise WsupError(message, status)
    return handle


def library_version(library=None):
    """The loaded libwsup_client.so's version, "major.minor.patch"."""
    _, lib = load_library(library)
    return _s(lib.wsup_client_version())
