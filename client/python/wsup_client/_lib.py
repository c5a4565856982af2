"""Finding and loading libwsup_client.so, and the C ABI's prototypes.

The library is the C ABI of client/wsup_client.h. It is looked for, in order:
  1. the path given to load_library(), or $WSUP_CLIENT_LIB (a file, or a
     folder that holds libwsup_client.so);
  2. beside this package (a copy installed next to wsup_client/);
  3. the build folders of the source tree this package sits in
     (build/lib, build-release/lib, ...);
  4. the dynamic linker's search path (LD_LIBRARY_PATH, ldconfig).
The first one that exists is loaded; a file that exists but does not load is
an error of its own (it is never skipped silently).
"""

import ctypes
import os
import threading

from ._errors import LibraryNotFoundError

LIB_NAME = "libwsup_client.so"
ENV_VAR = "WSUP_CLIENT_LIB"

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# client/python/wsup_client -> the repository root.
_SOURCE_ROOT = os.path.normpath(os.path.join(_PACKAGE_DIR, "..", "..", ".."))
_BUILD_DIRS = ("build", "build-release", "build-py")

_lock = threading.Lock()
_loaded = None  # (path, ctypes.CDLL)
_by_path = {}  # the library argument as given -> (path, CDLL), for calls that name one


def candidate_paths(path=None):
    """The paths load_library() tries, in order, as (path, where) pairs."""
    out = []
    explicit = path if path is not None else os.environ.get(ENV_VAR) or None
    if explicit:
        where = "the path given" if path is not None else "$" + ENV_VAR
        if os.path.isdir(explicit):
            explicit = os.path.join(explicit, LIB_NAME)
        out.append((explicit, where))
        return out  # an explicit choice is never second-guessed
    out.append((os.path.join(_PACKAGE_DIR, LIB_NAME), "beside the package"))
    if os.path.isfile(os.path.join(_SOURCE_ROOT, "client", "wsup_client.h")):
        for b in _BUILD_DIRS:
            out.append((os.path.join(_SOURCE_ROOT, b, "lib", LIB_NAME), "the source tree's " + b + "/"))
    out.append((LIB_NAME, "the dynamic linker's path (LD_LIBRARY_PATH)"))
    return out


def _declare(lib):
    c = ctypes
    p = c.c_void_p
    s = c.c_char_p
    protos = {
        "wsup_attach": (p, [s, s, s, s, s]),
        "wsup_status": (c.c_int, [p]),
        "wsup_error": (s, [p]),
        "wsup_from_holder": (c.c_int, [p]),
        "wsup_source": (s, [p]),
        "wsup_reason": (s, [p]),
        "wsup_diffs_json": (s, [p]),
        "wsup_attach_ms": (c.c_double, [p]),
        "wsup_holder_fingerprint_json": (s, [p]),
        "wsup_is_cuda": (c.c_int, [p]),
        "wsup_num_tensors": (c.c_size_t, [p]),
        "wsup_tensor_name": (s, [p, c.c_size_t]),
        "wsup_tensor_data": (p, [p, s]),
        "wsup_tensor_dtype": (s, [p, s]),
        "wsup_tensor_ndim": (c.c_int, [p, s]),
        "wsup_tensor_dim": (c.c_int64, [p, s, c.c_int]),
        "wsup_tensor_nbytes": (c.c_uint64, [p, s]),
        "wsup_tensor_stride": (c.c_int64, [p, s, c.c_int]),
        "wsup_manifest_table": (p, [p, c.POINTER(c.c_size_t)]),
        "wsup_tensor_copy_to_host": (c.c_int, [p, s, p, c.c_uint64]),
        "wsup_tensor_stride": (c.c_int64, [p, s, c.c_int]),
        "wsup_detach": (None, [p]),
        "wsup_client_version": (s, []),
        # Engine-made layouts (publish.py).
        "wsup_publish_begin": (p, [s, s, s, s, s]),
        "wsup_has_lease": (c.c_int, [p]),
        "wsup_publish_alloc": (c.c_int, [p, c.c_uint64, c.POINTER(c.c_void_p), c.POINTER(c.c_uint64),
                                         c.POINTER(c.c_uint32)]),
        "wsup_publish_commit": (c.c_int, [p, s]),
        "wsup_publish_abort": (c.c_int, [p, s]),
        "wsup_publish_locate": (c.c_int, [p, p, c.POINTER(c.c_uint32), c.POINTER(c.c_uint64)]),
        "wsup_publish_grant_ms": (c.c_double, [p]),
        "wsup_publish_set_allocator_target": (c.c_int, [p]),
        "wsup_torch_set_chunk_bytes": (c.c_int, [c.c_uint64]),
        "wsup_torch_reserve": (c.c_int, [p, c.c_uint64]),
        "wsup_torch_last_error": (s, []),
        "wsup_torch_usage": (c.c_int, [p, c.POINTER(c.c_uint64), c.POINTER(c.c_uint64), c.POINTER(c.c_uint64)]),
        "wsup_torch_malloc": (p, [c.c_ssize_t, c.c_int, p]),
        "wsup_torch_free": (None, [p, c.c_ssize_t, c.c_int, p]),
        # The node's KV pool and its journal (kv_pool.py).
        "wsup_kv_pool_fetch": (p, [s, c.c_int]),
        "wsup_kv_pool_status": (c.c_int, [p]),
        "wsup_kv_pool_error": (s, [p]),
        "wsup_kv_pool_json": (s, [p]),
        "wsup_kv_pool_allocations": (c.c_size_t, [p]),
        "wsup_kv_pool_fd": (c.c_int, [p, c.c_size_t]),
        "wsup_kv_pool_allocation_bytes": (c.c_uint64, [p, c.c_size_t]),
        "wsup_kv_pool_release": (None, [p]),
        "wsup_kv_token_hash": (c.c_uint64, [c.POINTER(c.c_int32), c.c_size_t, c.c_uint64]),
        # The death word (death_word.py).
        "wsup_arm_death_word": (c.c_int, [c.c_char_p, c.c_size_t]),
    }
    for name, (res, args) in protos.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def load_library(path=None):
    """Loads libwsup_client.so (once per process) and returns (path, CDLL).

    Raises LibraryNotFoundError naming every place looked at and the fix.
    """
    global _loaded
    with _lock:
        if _loaded is not None and path is None:
            return _loaded
        # Every attach() or publish() that names its library comes here; the
        # library is declared once per path (declaring its functions costs
        # milliseconds, a good part of a whole attach).
        key = None if path is None else str(path)
        if key is not None and key in _by_path:
            return _by_path[key]
        tried = []
        for cand, where in candidate_paths(path):
            is_bare_name = os.sep not in cand
            if not is_bare_name and not os.path.isfile(cand):
                tried.append("%s (%s): no such file" % (cand, where))
                continue
            try:
                lib = ctypes.CDLL(cand)
            except OSError as e:
                if is_bare_name:
                    tried.append("%s (%s): %s" % (cand, where, e))
                    continue
                raise LibraryNotFoundError(
                    "%s (%s) exists but does not load: %s; rebuild it with "
                    "`ninja -C build wsup_client_shared` on this machine" % (cand, where, e)) from e
            try:
                _declare(lib)
            except AttributeError as e:
                raise LibraryNotFoundError(
                    "%s (%s) is not the wsup client library or is too old (%s); point $%s at the "
                    "libwsup_client.so of this wsup version" % (cand, where, e, ENV_VAR)) from e
            result = (os.path.abspath(cand) if not is_bare_name else cand, lib)
            if path is None:
                _loaded = result
            else:
                _by_path[key] = result
            return result
        raise LibraryNotFoundError(
            "cannot find %s; looked at: %s. Build it with `ninja -C build wsup_client_shared` "
            "(it lands in build/lib/) and set %s=/path/to/%s, or put its folder on LD_LIBRARY_PATH"
            % (LIB_NAME, "; ".join(tried), ENV_VAR, LIB_NAME))
