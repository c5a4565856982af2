"""The node's KV pool, for an engine that keeps its KV cache there and
journals its sequences so that the engine promoted after its crash adopts
their pages (docs/kv_journal.md).

    pool = wsup_client.fetch_kv_pool("/run/wsup/holder.sock")
    pool.backend, pool.allocations    # "host" or "cuda"; sizes in bytes
    fd = pool.fds[0]                  # this process's own fd (os.close it when done)

Host pools are writable memfds (mmap them MAP_SHARED); cuda pools are
POSIX fds of VMM allocations. Nothing is mapped here: map the pool only
while the supervisor makes this engine the owner (POST /wsup/role
{"role": "active", "kv": "pool"}), and unmap it before answering
{"role": "standby"}.
"""

import ctypes
import json
import os

from ._errors import OK, WsupError
from ._lib import load_library

TOKEN_HASH_SEED = 0xCBF29CE484222325  # the hash of no tokens


class KvPool:
    """One fetch of the pool: its id, backend, device, allocation sizes, and
    one fd per allocation, each this process's own (dup'd from the
    library's handle, which is released at once)."""

    def __init__(self, desc, fds):
        self.id = desc["id"]
        self.backend = desc["backend"]
        self.device = desc["device"]
        self.allocations = list(desc["allocations"])
        self.fds = fds

    @property
    def bytes(self):
        return sum(self.allocations)

    def close(self):
        """Closes the fds (a mapping made from them stays valid)."""
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "KvPool(id=%s, backend=%s, bytes=%d, allocations=%d)" % (
            self.id, self.backend, self.bytes, len(self.allocations))


def fetch_kv_pool(socket_path, timeout_ms=5000, library=None):
    """Asks the holder at socket_path for the node's KV pool.

    Raises WsupError with the library's code and message (a holder without
    a pool: NOT_FOUND, naming --kv-pool-mib)."""
    if not isinstance(socket_path, (str, bytes, os.PathLike)):
        raise WsupError("fetch_kv_pool: socket_path must be a path, not %r" % (socket_path,), 1)
    _, lib = load_library(library)
    h = lib.wsup_kv_pool_fetch(os.fsencode(socket_path), int(timeout_ms))
    if not h:
        raise WsupError("fetch_kv_pool: out of memory")
    try:
        st = lib.wsup_kv_pool_status(h)
        if st != OK:
            raise WsupError(lib.wsup_kv_pool_error(h).decode(errors="replace"), st)
        desc = json.loads(lib.wsup_kv_pool_json(h).decode())
        fds = []
        try:
            for i in range(lib.wsup_kv_pool_allocations(h)):
                fds.append(os.dup(lib.wsup_kv_pool_fd(h, i)))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return KvPool(desc, fds)
    finally:
        lib.wsup_kv_pool_release(h)


def token_hash(ids, seed=TOKEN_HASH_SEED, library=None):
    """The journal's TokenHash of a sequence of token ids, extending seed."""
    _, lib = load_library(library)
    ids = list(ids)
    arr = (ctypes.c_int32 * len(ids))(*ids)
    return lib.wsup_kv_token_hash(arr, len(ids), seed)
