"""DLPack export of attached tensors, built with ctypes (no compiled code).

A tensor is handed to a consumer (torch.from_dlpack, numpy.from_dlpack) as a
"dltensor" PyCapsule around a DLManagedTensor (dlpack.h, the unversioned
struct every consumer accepts):

    DLManagedTensor { DLTensor dl_tensor; void* manager_ctx;
                      void (*deleter)(DLManagedTensor*); }
    DLTensor { void* data; DLDevice device; int32 ndim; DLDataType dtype;
               int64* shape; int64* strides; uint64 byte_offset; }

Ownership: exported structs, their shape and strides arrays and a reference
to the owner of the memory (the attachment) are held by `_live`, keyed by
each struct's address, until the consumer calls that struct's deleter (when
its tensor is freed); a batch of structs is freed with its last entry. A capsule that is never consumed calls the deleter from its
own destructor, as the DLPack protocol says. So the mapping stays alive as
long as any tensor made from it does.

The deleter and the capsule destructor are Python functions called from C;
ctypes takes the GIL for them, so a tensor may be freed on any thread.
"""

import ctypes
import struct
import threading

# DLDeviceType
KDL_CPU = 1
KDL_CUDA = 2
# DLDataTypeCode
KDL_INT = 0
KDL_UINT = 1
KDL_FLOAT = 2
KDL_BFLOAT = 4
KDL_BOOL = 6


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]

_CAPSULE_NAME = b"dltensor"
_USED_CAPSULE_NAME = b"used_dltensor"
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

# DLManagedTensor packed by hand (64 bytes on a 64-bit ABI; checked below
# against the ctypes declaration): data, device_type, device_id, ndim, code,
# bits, lanes, shape, strides, byte_offset, manager_ctx, deleter. Packing is
# several times faster than filling a ctypes.Structure field by field, which
# matters at 20,000 tensors.
_PACK = struct.Struct("=QiiiBBHQQQQQ")
assert _PACK.size == ctypes.sizeof(DLManagedTensor) and DLManagedTensor.deleter.offset == 56

_live_lock = threading.RLock()  # re-entrant: a GC pass may run a deleter while it is held
_live = {}  # address of a DLManagedTensor -> its _Batch, until the deleter runs


class _Batch:
    """The memory of some exported DLManagedTensors (structs, shapes,
    strides) and the owner of the tensor memory; freed when the last of its
    tensors is deleted."""

    __slots__ = ("structs", "dims", "owner")


def live_exports():
    """How many exported tensors a consumer still holds (for tests)."""
    with _live_lock:
        return len(_live)


def _delete(address):
    with _live_lock:
        _live.pop(address, None)


def _destroy_capsule(capsule):
    # Consumed capsules were renamed by the consumer, which owns the deleter call.
    if _api.PyCapsule_IsValid(capsule, _USED_CAPSULE_NAME):
        return
    address = _api.PyCapsule_GetPointer(capsule, _CAPSULE_NAME)
    if address:
        _delete(address)


# Kept for the life of the process: C holds pointers to these trampolines.
_deleter_fn = _DELETER(_delete)
_deleter_address = ctypes.cast(_deleter_fn, ctypes.c_void_p).value
_capsule_destructor_fn = _CAPSULE_DESTRUCTOR(_destroy_capsule)


def make_capsules(owner, items, device_type, device_id):
    """"dltensor" capsules, one per item of `items`: (data_ptr, shape, code,
    bits) for a C-contiguous tensor, or (data_ptr, shape, code, bits,
    strides) with strides in elements (None: contiguous). owner: any object
    that keeps the memory alive; it is held until the consumer's deleter of
    the last one runs."""
    n = len(items)
    flat = []
    for item in items:
        shape = item[1]
        flat.extend(shape)
        given = item[4] if len(item) > 4 else None
        if given is not None:
            flat.extend(given)
            continue
        stride = 1
        strides = []
        for d in reversed(shape):
            strides.append(stride)
            stride *= max(int(d), 1)
        flat.extend(reversed(strides))
    batch = _Batch()
    batch.owner = owner
    batch.structs = ctypes.create_string_buffer(_PACK.size * max(n, 1))
    batch.dims = (ctypes.c_int64 * max(len(flat), 1))(*flat)
    base = ctypes.addressof(batch.structs)
    dims = ctypes.addressof(batch.dims)
    pack = _PACK.pack_into
    new_capsule = _api.PyCapsule_New
    out = []
    with _live_lock:
        for i, item in enumerate(items):
            data_ptr, shape, code, bits = item[:4]
            ndim = len(shape)
            address = base + i * _PACK.size
            pack(batch.structs, i * _PACK.size, data_ptr, device_type, device_id, ndim, code, bits, 1, dims,
                 dims + 8 * ndim, 0, 0, _deleter_address)
            dims += 16 * ndim
            _live[address] = batch
            out.append(address)
    capsules = []
    try:
        for address in out:
            capsules.append(new_capsule(address, _CAPSULE_NAME, _capsule_destructor_fn))
    except BaseException:
        for address in out[len(capsules):]:
            _delete(address)
        raise
    return capsules


def make_capsule(owner, data_ptr, shape, code, bits, device_type, device_id, strides=None):
    """One "dltensor" capsule (see make_capsules)."""
    return make_capsules(owner, [(data_ptr, tuple(shape), code, bits, strides)], device_type, device_id)[0]


class Exported:
    """An object speaking the DLPack protocol (__dlpack__, __dlpack_device__)
    for consumers that take one, e.g. numpy.from_dlpack(Exported(...))."""

    def __init__(self, owner, data_ptr, shape, code, bits, device_type, device_id, strides=None):
        self._args = (owner, data_ptr, tuple(int(d) for d in shape), code, bits, device_type, device_id,
                      None if strides is None else tuple(int(d) for d in strides))

    def __dlpack__(self, stream=None, **kwargs):
        # The memory is written once by the holder before it is handed out;
        # there is no producer stream to order against.
        return make_capsule(*self._args)

    def __dlpack_device__(self):
        return (self._args[5], self._args[6])
