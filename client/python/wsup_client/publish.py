"""publish() and Publication: write an engine-made layout (a holder started
with --layout engine) from Python, or attach it when another engine did.

    pub = wsup_client.publish(sock, "daemon", checkpoint_dir=d, backend="cuda",
                              engine={"name": "my-engine", "version": "1.0",
                                      "transform": "hf-fused-experts/v1"})
    if pub.attached:                      # committed by an earlier engine
        att = pub.attachment
    else:                                 # this process writes it
        with pub.torch_pool():            # torch allocates inside the lease
            model = AutoModelForCausalLM.from_pretrained(d, device_map="cuda:0")
        att = pub.commit(model.state_dict())
    # readers: wsup_client.attach(sock, "daemon", checkpoint_dir=d,
    #          backend="cuda", engine=<the same>) and bind_module(...)

The layout's fingerprint is the checkpoint's (or `fingerprint`) plus the
engine's name, version and transform, so another revision, engine or
transform is another layout (checkpoint/fingerprint.h, AddEngineLayout).

Lifetime rules (docs/python.md, "Engine-made layouts"):
- The lease is held by this process from publish() until commit(),
  abort(), or the handle's end (close(), or the last object that holds it
  going away); a process that dies loses it, and the holder gives it to the
  next engine that waits.
- torch_pool() keeps its torch.cuda.MemPool alive in the Publication and in
  the Attachment that commit() returns: keep one of them for as long as the
  tensors allocated in the pool live (a writer that goes on computing from
  its model keeps the Attachment). The memory itself stays mapped as long
  as torch holds any block of it, whatever happens to these objects.
- After commit() the memory belongs to the layout: the writer's tensors
  are the layout's (same addresses, same bytes every reader sees). Never
  write to them: on cuda a write changes every reader's weights (VMM
  cannot map them read-only), on host they are mapped read-only (a write
  faults). Nothing more is allocated from the lease.
- alloc_tensor() (host) arrays are writable until commit(), read-only
  after it; not even read during it.

Thread-safety: one Publication is used from one thread; torch may allocate
into the pool from its own threads (the C library serializes).
"""

import contextlib
import ctypes
import json
import os
import sys
import threading
import time
import weakref

from . import _dlpack
from ._attach import DTYPES, MODES, Attachment, _b, _contiguous, _s, engine_options, open_handle, request_options
from ._errors import INVALID_ARGUMENT, NOT_FOUND, OK, UNAVAILABLE, WsupError
from ._lib import load_library

# Every entry's offset is a multiple of this (wire/manifest.h kTensorAlignment).
ALIGNMENT = 256
# How long publish() waits for a layout another process is writing.
DEFAULT_WAIT_MS = 600000
# The least a host alloc_tensor() grant asks for.
HOST_CHUNK_BYTES = 64 << 20
# The smallest torch_pool grant when no checkpoint size says better (the C default).
_GIB = 1 << 30

# The dtypes a manifest holds (checkpoint/checkpoint.h DType), by torch name.
TORCH_TO_ST = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2", "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
    "bool": "BOOL",
}
# numpy (kind, itemsize) -> safetensors dtype. numpy has no BF16 or F8_*:
# arrays of their raw bits are uint16 / uint8, named by dtypes= or
# remembered from alloc_tensor().
NUMPY_TO_ST = {
    ("f", 8): "F64", ("f", 4): "F32", ("f", 2): "F16", ("i", 8): "I64", ("i", 4): "I32", ("i", 2): "I16",
    ("i", 1): "I8", ("u", 1): "U8", ("b", 1): "BOOL",
}
ITEM_SIZE = {name: int(DTYPES[name][0][2:]) for name in TORCH_TO_ST.values()}

_torch_allocators = {}  # library path -> torch.cuda.memory.CUDAPluggableAllocator
_torch_lock = threading.Lock()


def _align(n):
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class _Reserve:
    """wsup_torch_reserve on a thread of its own; error: its message, or None."""

    def __init__(self, lib, ptr, nbytes):
        self.error = None
        self._lib, self._ptr, self._nbytes = lib, ptr, nbytes
        self._thread = threading.Thread(target=self._run, name="wsup-reserve", daemon=True)
        self._thread.start()

    def _run(self):
        if self._lib.wsup_torch_reserve(self._ptr, self._nbytes) != OK:
            self.error = _s(self._lib.wsup_error(self._ptr)) or "wsup_torch_reserve failed"

    def join(self):
        self._thread.join()


class CommitReport:
    """What commit() did with each name: in_place (names recorded where
    they lie in the lease), tied ({alias: name} for views identical to an
    earlier name's, committed once), copied (names written into a fresh
    grant, with copied_bytes and reasons {name: why}), and the bytes of the
    in-place tensors (in_place_bytes). Where the time went, in ms: prepare_ms
    (describing and placing the tensors, and any copies), sync_ms (waiting
    for the device's queued writes) and holder_ms (the library's commit: the
    holder's checks and its reply, mapped); grant_ms: the time the lease spent
    getting its grants before the commit (the holder's round trips and the
    mappings, inside the load)."""

    def __init__(self):
        self.prepare_ms = self.sync_ms = self.holder_ms = self.grant_ms = 0.0
        self.in_place = []
        self.in_place_bytes = 0
        self.tied = {}
        self.copied = []
        self.copied_bytes = 0
        self.reasons = {}

    def __repr__(self):
        return "CommitReport(%d in place, %d tied, %d copied (%d bytes))" % (
            len(self.in_place), len(self.tied), len(self.copied), self.copied_bytes)


class _Source:
    """One value to commit, described once: where its bytes are and how."""

    __slots__ = ("name", "value", "torch", "ptr", "dtype", "shape", "strides", "item", "span", "numel", "cuda",
                 "device")


class _WritableBuffer:
    """The `base` of a writable numpy array over lease memory; keeps the
    handle (and so the mapping) alive."""

    __slots__ = ("handle", "__array_interface__", "__weakref__")

    def __init__(self, handle, data_ptr, typestr, shape):
        self.handle = handle
        self.__array_interface__ = {"version": 3, "data": (data_ptr, False), "typestr": typestr,
                                    "shape": tuple(shape), "strides": None}


class Publication:
    """The outcome of publish(): the committed layout (attached is True,
    attachment an Attachment as attach() gives), or this process's write
    lease (has_lease), or neither (client mode: reason says why; load from
    disk)."""

    def __init__(self, handle, mode, device, lib_path):
        lib, p = handle.lib, handle.ptr
        self._handle = handle
        self._lib_path = lib_path
        self.mode = mode
        self.device = device
        self.source = _s(lib.wsup_source(p))
        self.reason = _s(lib.wsup_reason(p))
        self.attached = bool(lib.wsup_from_holder(p))
        self.attachment = Attachment(handle, mode, device) if self.attached else None
        self.is_cuda = bool(lib.wsup_is_cuda(p))
        self.report = None
        self.reserve_error = None  # why torch_pool's first grant, asked for ahead, was refused
        self._pools = []        # torch MemPools, kept for the tensors in them
        self._chunks = []       # host alloc_tensor grants: [ptr, size, used]
        self._dtypes = {}       # host alloc_tensor: data address -> safetensors dtype
        self._arrays = []       # weak references to alloc_tensor's numpy arrays
        self._size_hint = 0     # the checkpoint's bytes, for torch_pool's first grant

    # ------------------------------------------------------------ state

    @property
    def has_lease(self):
        h = self._handle
        return h is not None and bool(h.lib.wsup_has_lease(h.ptr))

    def _lease(self, what):
        h = self._handle
        if h is None:
            raise WsupError("%s: this publication was closed" % what, INVALID_ARGUMENT)
        if not h.lib.wsup_has_lease(h.ptr):
            why = "it attached the committed layout" if self.attached else (
                "it holds no write lease (%s)" % (self.reason or "committed or aborted"))
            raise WsupError("%s: %s; only a publication that holds the lease writes" % (what, why), INVALID_ARGUMENT)
        return h

    def _error(self, h, what, rc):
        return WsupError("%s: %s" % (what, _s(h.lib.wsup_error(h.ptr)) or "status %d" % rc), rc)

    def close(self):
        """Lets go of this object's hold on the handle. Before a commit this
        gives the lease up once nothing else holds the handle (alloc_tensor
        tensors, an Attachment)."""
        self._handle = None
        self._pools = []

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and self.has_lease:
            self.abort("the writer failed: %s: %s" % (exc_type.__name__, exc))
        self.close()

    # ------------------------------------------------------------ memory

    def alloc(self, nbytes):
        """nbytes more bytes from the holder: (address, size, alloc index).
        A host address, or a CUDA device address for a cuda lease."""
        h = self._lease("alloc")
        data = ctypes.c_void_p()
        size = ctypes.c_uint64()
        index = ctypes.c_uint32()
        rc = h.lib.wsup_publish_alloc(h.ptr, int(nbytes), ctypes.byref(data), ctypes.byref(size),
                                      ctypes.byref(index))
        if rc != OK:
            raise self._error(h, "alloc of %d bytes" % nbytes, rc)
        return data.value, size.value, index.value

    def locate(self, address):
        """(alloc, offset) of an address inside the lease; None when it is in
        none of its grants."""
        h = self._lease("locate")
        alloc = ctypes.c_uint32()
        offset = ctypes.c_uint64()
        rc = h.lib.wsup_publish_locate(h.ptr, ctypes.c_void_p(address), ctypes.byref(alloc), ctypes.byref(offset))
        if rc == NOT_FOUND:
            return None
        if rc != OK:
            raise WsupError("locate: status %d" % rc, rc)
        return alloc.value, offset.value

    def alloc_tensor(self, shape, dtype="F32", kind="numpy"):
        """A writable array in the lease (host leases): kind "numpy" (BF16 and
        F8_* as their raw bits, uint16 / uint8) or "torch" (a CPU tensor of
        the real dtype). dtype: a safetensors name ("F32", "BF16", ...).
        Arrays are placed one after another, 256-byte aligned, in grants of
        at least 64 MiB. They are read-only after commit()."""
        h = self._lease("alloc_tensor")
        if self.is_cuda:
            raise WsupError("alloc_tensor is for host leases; on cuda, allocate with torch inside torch_pool()",
                            INVALID_ARGUMENT)
        entry = DTYPES.get(dtype) if dtype in ITEM_SIZE else None
        if entry is None:
            raise WsupError("alloc_tensor: dtype %r is not one of %s" % (dtype, ", ".join(ITEM_SIZE)),
                            INVALID_ARGUMENT)
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise WsupError("alloc_tensor: shape %s has a negative dimension" % (list(shape),), INVALID_ARGUMENT)
        nbytes = ITEM_SIZE[dtype]
        for d in shape:
            nbytes *= d
        ptr = self._carve_host(max(nbytes, 1))
        self._dtypes[ptr] = dtype
        if kind == "numpy":
            import numpy as np
            arr = np.asarray(_WritableBuffer(h, ptr, entry[0], shape))
            self._arrays.append(weakref.ref(arr))
            return arr
        if kind == "torch":
            import torch
            from torch.utils import dlpack as tdl
            _, (code, bits), view_as = entry
            t = tdl.from_dlpack(_dlpack.make_capsules(h, [(ptr, shape, code, bits)], _dlpack.KDL_CPU, 0)[0])
            return t if view_as is None else t.view(getattr(torch, view_as))
        raise WsupError("alloc_tensor: kind %r is not one of numpy, torch" % (kind,), INVALID_ARGUMENT)

    def _carve_host(self, nbytes):
        for chunk in self._chunks:
            at = _align(chunk[2])
            if at + nbytes <= chunk[1]:
                chunk[2] = at + nbytes
                return chunk[0] + at
        ptr, size, _ = self.alloc(max(nbytes, HOST_CHUNK_BYTES))
        self._chunks.append([ptr, size, nbytes])
        return ptr

    @contextlib.contextmanager
    def torch_pool(self, *, all_threads=True, chunk_bytes=None):
        """A context manager in which torch allocates on the lease's device
        inside the lease (cuda leases): a torch.cuda.MemPool over the
        library's pluggable allocator (wsup_torch_malloc), targeted at this
        publication. Everything torch allocates there in the block (e.g.
        from_pretrained(d, device_map="cuda:0")) is carved from grants of at
        least chunk_bytes (the setting stays for later grants of this
        process). The default is the size of checkpoint_dir's safetensors
        files plus 1/64 (at least 64 MiB) of slack, so that a model loads into one grant (each grant is
        a round trip to the holder and a mapping: at 1 GiB a 20 GiB model
        paid for 21), or 1 GiB when the publication has no checkpoint_dir.
        With a known size (a checkpoint_dir, or chunk_bytes), that first
        grant is asked for on entry, on a thread of its own, while the loader
        builds its model; a refusal is kept in reserve_error, and the
        loader's own allocations then ask again.

        all_threads (default): allocations of every thread and stream on the
        device go to the pool while the block runs (a loader may load on
        worker threads: transformers 5 does); False routes only this
        thread's (torch.cuda.use_mem_pool). Tensors allocated outside the
        pool are copied by commit(). Yields the MemPool. A failed allocation
        raises WsupError with the allocator's reason (the holder's refusal,
        most often: its GPU is full)."""
        h = self._lease("torch_pool")
        if not self.is_cuda:
            raise WsupError("torch_pool needs a cuda lease (a holder started with --backend cuda, published with "
                            "backend='cuda'); on host, use alloc_tensor()", INVALID_ARGUMENT)
        import torch
        lib = h.lib
        allocator = _pluggable(torch, self._lib_path)
        if chunk_bytes is None and self._size_hint > 0:
            chunk_bytes = max(_GIB, self._size_hint + max(64 << 20, self._size_hint // 64))
        if chunk_bytes is not None:
            if lib.wsup_torch_set_chunk_bytes(int(chunk_bytes)) != OK:
                raise WsupError("torch_pool: chunk_bytes %r is out of range (1 byte to 1 TiB)" % (chunk_bytes,),
                                INVALID_ARGUMENT)
        rc = lib.wsup_publish_set_allocator_target(h.ptr)
        if rc != OK:
            raise self._error(h, "torch_pool", rc)
        raw = allocator.allocator() if hasattr(allocator, "allocator") else allocator._allocator
        pool = torch.cuda.MemPool(raw)
        self._pools.append(pool)
        expandable = _expandable_segments()
        if expandable:
            # A pool with a pluggable allocator cannot use expandable segments.
            torch.cuda.memory._set_allocator_settings("expandable_segments:False")
        # The first grant (a round trip to the holder and a mapping: over
        # 100 ms for 20 GiB) is asked for at once, on a thread of its own,
        # while the loader reads configs and builds its model; its first
        # allocation then finds the grant ready (or waits for it). ctypes
        # lets go of the GIL for the call.
        reserve = None
        if chunk_bytes is not None:
            reserve = _Reserve(lib, h.ptr, int(chunk_bytes))
        try:
            with _route(torch, pool, self.device, all_threads):
                yield pool
        except torch.OutOfMemoryError as e:
            raise WsupError("torch_pool: an allocation in the lease failed: %s" %
                            (_s(lib.wsup_torch_last_error()) or e), UNAVAILABLE) from e
        finally:
            if reserve is not None:
                reserve.join()
                # A refused reservation leaves the loader to ask for its own
                # grants, which fail the load if the holder refuses them too.
                self.reserve_error = reserve.error
            lib.wsup_publish_set_allocator_target(None)
            if expandable:
                torch.cuda.memory._set_allocator_settings("expandable_segments:True")

    def usage(self):
        """(bytes granted to torch_pool, bytes in live blocks, live blocks)."""
        h = self._handle
        if h is None:
            return 0, 0, 0
        granted, used, blocks = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        h.lib.wsup_torch_usage(h.ptr, ctypes.byref(granted), ctypes.byref(used), ctypes.byref(blocks))
        return granted.value, used.value, blocks.value

    # ------------------------------------------------------------ commit

    def commit(self, tensors, *, dtypes=None):
        """Commits `tensors` (a mapping name -> torch tensor or numpy array,
        e.g. model.state_dict()) as the layout and returns its Attachment
        (source "published"); its .report is a CommitReport.

        Each value whose bytes lie in the lease (one grant, an offset that is
        a multiple of 256, non-negative strides) is recorded where it is,
        with its dtype, shape and strides. A value that is the same view as
        an earlier name's (tied weights) is committed once and reported as
        tied. Any other value (allocated outside the lease, overlapping
        another, misaligned, on another device) is copied into one fresh
        grant, contiguous, and reported as copied, so readers get every
        name. dtypes: {name: safetensors dtype} for numpy arrays of raw bits
        (BF16 as uint16). A refused commit raises WsupError naming what the
        holder refused; the lease is kept (fix and commit again, or abort)."""
        h = self._lease("commit")
        t0 = time.perf_counter()
        dtypes = dtypes or {}
        report = CommitReport()
        seen = {}  # (ptr, dtype, shape, strides) -> first name
        sources = []
        for name, value in tensors.items():
            s = self._describe(str(name), value, dtypes.get(name))
            key = (s.ptr, s.dtype, s.shape, s.strides)
            if s.numel > 0 and key in seen:
                report.tied[s.name] = seen[key]
                continue
            seen[key] = s.name
            sources.append(s)
        in_place, copies = self._place(sources, report)
        entries = []
        for s, (alloc, offset) in in_place:
            e = {"name": s.name, "dtype": s.dtype, "shape": list(s.shape), "alloc": alloc, "offset": offset}
            if s.strides != _contiguous(s.shape):
                e["strides"] = list(s.strides)
            entries.append(e)
            report.in_place.append(s.name)
            report.in_place_bytes += s.span
        entries.extend(self._copy(copies, report))
        body = _b(json.dumps(entries))
        t1 = time.perf_counter()
        if self.is_cuda and "torch" in sys.modules:
            import torch
            torch.cuda.synchronize(self.device)  # the C library waits for the device too
        t2 = time.perf_counter()
        report.grant_ms = h.lib.wsup_publish_grant_ms(h.ptr)
        rc = h.lib.wsup_publish_commit(h.ptr, body)
        t3 = time.perf_counter()
        report.prepare_ms, report.sync_ms, report.holder_ms = ((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)
        if rc != OK:
            raise self._error(h, "commit refused (the lease is kept: fix and commit again, or abort)", rc)
        att = Attachment(h, self.mode, self.device)
        att.report = report
        att._keep = list(self._pools)  # the pool must outlive its tensors (see the top of this file)
        self.report = report
        self.attachment = att
        self.attached = True
        self.source = att.source
        for ref in self._arrays:
            arr = ref()
            if arr is not None:
                arr.flags.writeable = False
        self._arrays = []
        return att

    def _describe(self, name, v, dtype_override):
        s = _Source()
        s.name = name
        s.value = v
        mod = type(v).__module__.split(".")[0]
        if mod == "torch":
            import torch
            if v.is_meta:
                raise WsupError("commit: %r is on the meta device: it has no bytes to commit" % name, INVALID_ARGUMENT)
            if v.layout != torch.strided:
                raise WsupError("commit: %r is a %s tensor; only strided (dense) tensors can be committed" %
                                (name, v.layout), INVALID_ARGUMENT)
            st = TORCH_TO_ST.get(str(v.dtype).replace("torch.", ""))
            if st is None and dtype_override is None:
                raise WsupError("commit: %r has dtype %s, which a layout cannot hold (%s); convert it, or name "
                                "its bits with dtypes={%r: ...}" % (name, v.dtype, ", ".join(ITEM_SIZE), name),
                                INVALID_ARGUMENT)
            s.torch = True
            s.ptr = v.data_ptr()
            s.dtype = dtype_override or st
            s.shape = tuple(int(d) for d in v.shape)
            s.strides = tuple(int(d) for d in v.stride())
            s.item = v.element_size()
            s.cuda = v.is_cuda
            s.device = v.device.index if v.is_cuda else None
        elif hasattr(v, "__array_interface__") and hasattr(v, "dtype"):
            s.torch = False
            s.ptr = v.__array_interface__["data"][0]
            s.item = v.dtype.itemsize
            st = dtype_override or self._dtypes.get(s.ptr) or NUMPY_TO_ST.get((v.dtype.kind, s.item))
            if st is None or ITEM_SIZE.get(st) != s.item:
                raise WsupError("commit: %r is a numpy array of %s, which names none of the dtypes a layout holds "
                                "(%s) with its item size; convert it, or give dtypes={%r: 'BF16'} (or the like) "
                                "for raw bits" % (name, v.dtype, ", ".join(ITEM_SIZE), name), INVALID_ARGUMENT)
            s.dtype = st
            s.shape = tuple(int(d) for d in v.shape)
            if all(b % s.item == 0 for b in v.strides):
                s.strides = tuple(b // s.item for b in v.strides)
            else:
                s.strides = None  # not in whole elements: copied
            s.cuda = False
            s.device = None
        else:
            raise WsupError("commit: %r is a %s, not a torch tensor or numpy array" % (name, type(v).__name__),
                            INVALID_ARGUMENT)
        if s.dtype not in ITEM_SIZE or ITEM_SIZE[s.dtype] != s.item:
            raise WsupError("commit: %r: dtype %s is not one of %s with the value's %d-byte items" %
                            (name, s.dtype, ", ".join(ITEM_SIZE), s.item), INVALID_ARGUMENT)
        s.numel = 1
        for d in s.shape:
            s.numel *= d
        if s.numel == 0 or s.strides is None or any(st_ < 0 for st_ in s.strides):
            s.span = 0
        else:
            s.span = (1 + sum((d - 1) * st_ for d, st_ in zip(s.shape, s.strides))) * s.item
        return s

    def _place(self, sources, report):
        """Splits the sources into (source, (alloc, offset)) recorded in place
        and the ones to copy (with their reasons)."""
        placed, copies = [], []
        for s in sources:
            why = None
            if s.numel == 0:
                why = "empty"
            elif s.strides is None or any(st_ < 0 for st_ in s.strides):
                why = "strides that are not whole non-negative elements"
            elif any(st_ == 0 and d > 1 for d, st_ in zip(s.shape, s.strides)):
                why = "a broadcast (stride 0) view"
            elif s.cuda != self.is_cuda or (s.cuda and s.device != self.device):
                why = "on %s, the lease is on %s" % ("cuda:%d" % s.device if s.cuda else "the host",
                                                     "cuda:%d" % self.device if self.is_cuda else "the host")
            else:
                first = self.locate(s.ptr)
                last = self.locate(s.ptr + s.span - 1)
                if first is None or last is None:
                    why = "not in the lease"
                elif first[0] != last[0]:
                    why = "spans two grants"
                elif first[1] % ALIGNMENT != 0:
                    why = "offset %d is not a multiple of %d" % (first[1], ALIGNMENT)
                else:
                    placed.append((s, first))
                    continue
            report.reasons[s.name] = why
            copies.append(s)
        # The holder refuses overlapping entries: the later of two that
        # overlap (but are not the same view: those were tied) is copied.
        placed.sort(key=lambda p: p[1])
        kept, end = [], {}
        for s, (alloc, offset) in placed:
            prev = end.get(alloc)
            if prev is not None and offset < prev[0]:
                report.reasons[s.name] = "overlaps %r" % prev[1]
                copies.append(s)
                continue
            end[alloc] = (offset + s.span, s.name)
            kept.append((s, (alloc, offset)))
        return kept, copies

    def _copy(self, copies, report):
        """Writes every value of `copies` into one fresh grant, contiguous;
        returns their entries."""
        if not copies:
            return []
        layout, cursor = [], 0
        for s in copies:
            at = _align(cursor)
            nbytes = s.numel * s.item
            layout.append((s, at, nbytes))
            cursor = at + nbytes
        base, _, alloc = self.alloc(max(cursor, 1))
        h = self._handle
        if self.is_cuda:
            import torch
            from torch.utils import dlpack as tdl
            dst = tdl.from_dlpack(_dlpack.make_capsules(h, [(base, (max(cursor, 1),), _dlpack.KDL_UINT, 8)],
                                                        _dlpack.KDL_CUDA, self.device)[0])
            for s, at, nbytes in layout:
                if nbytes == 0:
                    continue
                if s.torch:
                    src = s.value.detach()
                else:
                    import numpy as np
                    src = torch.from_numpy(np.ascontiguousarray(s.value))
                src = src.to(device=dst.device).contiguous().reshape(-1).view(torch.uint8)
                dst[at:at + nbytes].copy_(src)
            torch.cuda.synchronize(self.device)
        else:
            for s, at, nbytes in layout:
                if nbytes == 0:
                    continue
                if s.torch:
                    src = s.value.detach().cpu().contiguous()
                    ctypes.memmove(base + at, src.data_ptr(), nbytes)
                else:
                    import numpy as np
                    src = np.ascontiguousarray(s.value)
                    ctypes.memmove(base + at, src.ctypes.data, nbytes)
        entries = []
        for s, at, nbytes in layout:
            entries.append({"name": s.name, "dtype": s.dtype, "shape": list(s.shape), "alloc": alloc, "offset": at})
            report.copied.append(s.name)
            report.copied_bytes += nbytes
        return entries

    def abort(self, reason=""):
        """Gives the lease up: the holder releases the memory (blocks torch
        still holds stay mapped until freed) and the next waiting engine
        gets the lease."""
        h = self._lease("abort")
        rc = h.lib.wsup_publish_abort(h.ptr, _b(str(reason)[:1000]))
        if rc != OK:
            raise self._error(h, "abort", rc)

    def __repr__(self):
        if self.attached:
            return "Publication(attached, %r)" % (self.attachment,)
        if self.has_lease:
            return "Publication(lease, %s)" % ("cuda:%d" % self.device if self.is_cuda else "host")
        return "Publication(source=%s, reason=%r)" % (self.source, self.reason)


def _expandable_segments():
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
    return "expandable_segments:True" in conf.replace(" ", "")


def _pluggable(torch, path):
    """The process's CUDAPluggableAllocator over this library (one per path:
    torch cannot be given the same functions twice)."""
    with _torch_lock:
        a = _torch_allocators.get(path)
        if a is None:
            a = torch.cuda.memory.CUDAPluggableAllocator(path, "wsup_torch_malloc", "wsup_torch_free")
            _torch_allocators[path] = a
        return a


@contextlib.contextmanager
def _route(torch, pool, device, all_threads):
    c = torch._C
    private = all(hasattr(c, n) for n in ("_cuda_beginAllocateToPool", "_cuda_endAllocateToPool",
                                           "_cuda_releasePool"))
    if all_threads and private:
        # What torch.cuda.use_mem_pool does, with a filter that takes every
        # thread's and stream's allocations instead of this thread's.
        c._cuda_beginAllocateToPool(device, pool.id)
        try:
            yield
        finally:
            c._cuda_endAllocateToPool(device, pool.id)
            c._cuda_releasePool(device, pool.id)
        return
    with torch.cuda.use_mem_pool(pool, device=device):
        yield


def publish(socket_path, mode="daemon", *, checkpoint_dir=None, fingerprint=None, engine=None, backend="host",
            device=0, wait_ms=DEFAULT_WAIT_MS, client_name="engine", timeout_ms=10000, tp_size=1, tp_rank=0,
            pp_size=1, pp_rank=0, dp_size=1, ep_size=1, ep_rank=0, revision="", library=None):
    """Attaches the engine-made layout of this fingerprint from the holder at
    socket_path, or gets the lease to write it (wsup_publish_begin).

    The fingerprint is checkpoint_dir's (computed as attach() does, with
    backend, device, tp_* ...) or `fingerprint` (a dict or JSON text), plus
    `engine`: the engine's identity, a dict {name, version, transform} (or a
    (name, version, transform) tuple), required unless `fingerprint`
    already names it. Readers pass the same to attach(engine=...).

    While another process writes the layout this waits up to wait_ms for
    its commit (or for the lease, if that writer dies). Modes as attach():
    daemon raises WsupError on any failure; client returns a Publication
    with neither attached nor has_lease and the reason; off asks nothing.
    backend must be the holder's ("cuda" for --backend cuda: the lease's
    memory is then on this process's cuda `device`, that GPU)."""
    if mode not in MODES:
        raise WsupError("mode %r is not one of %s" % (mode, ", ".join(MODES)), INVALID_ARGUMENT)
    path, lib = load_library(library)
    if fingerprint is not None and not isinstance(fingerprint, str):
        fingerprint = json.dumps(fingerprint)
    opts = request_options(checkpoint_dir=checkpoint_dir, backend=backend, device=device, client_name=client_name,
                           timeout_ms=timeout_ms, tp_size=tp_size, tp_rank=tp_rank, pp_size=pp_size, pp_rank=pp_rank,
                           dp_size=dp_size, ep_size=ep_size, ep_rank=ep_rank, revision=revision)
    opts.update(engine_options(engine))
    opts["wait_ms"] = int(wait_ms)
    handle = open_handle(lib, "wsup_publish_begin", socket_path, mode, fingerprint, checkpoint_dir, opts)
    pub = Publication(handle, mode, int(device), path)
    pub._size_hint = _checkpoint_bytes(checkpoint_dir)
    return pub


def _checkpoint_bytes(checkpoint_dir):
    """The bytes of checkpoint_dir's safetensors files (0 when unknown): how
    much a loader will most likely allocate in the lease."""
    if checkpoint_dir is None:
        return 0
    total = 0
    try:
        for entry in os.scandir(checkpoint_dir):
            if entry.name.endswith(".safetensors"):
                total += entry.stat().st_size
    except OSError:
        return 0
    return total
