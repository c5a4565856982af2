"""wsup_client: attach a wsup holder's weights from Python, zero-copy.

    import wsup_client
    att = wsup_client.attach("/run/wsup/holder.sock", "client",
                             checkpoint_dir="/models/x", backend="cuda")
    if att.from_holder:
        tensors = att.tensors()          # name -> torch.Tensor on cuda:0
    else:
        print("load from disk:", att.reason, att.diffs)

    # engine-made layouts: write this engine's own post-load tensors once,
    # every later engine attaches them (see wsup_client.publish)
    pub = wsup_client.publish(sock, "daemon", checkpoint_dir="/models/x", backend="cuda",
                              engine={"name": "my-engine", "version": "1", "transform": "t/v1"})

A thin layer over the C ABI of libwsup_client.so (client/wsup_client.h)
through ctypes; no compiled extension. numpy is needed for host arrays,
torch for tensors; neither is imported until used. See docs/python.md.
"""

from ._attach import DTYPES, MODES, Attachment, TensorInfo, attach, library_version
from ._errors import (CODE_NAMES, CORRUPT, INTERNAL, INVALID_ARGUMENT, IO, MISMATCH, NOT_FOUND, OK, REFUSED,
                      TIMEOUT, UNAVAILABLE, LibraryNotFoundError, UnknownTensorError, WsupError)
from ._lib import ENV_VAR, LIB_NAME, candidate_paths, load_library
from .death_word import (DEATH_WORD_BYTES, DEATH_WORD_OFFSET, FUTEX_OWNER_DIED, FUTEX_TID_MASK, FUTEX_WAITERS,
                         arm_death_word, make_death_word, read_death_word)
from .convert import dequantize_block_fp8, dequantize_checkpoint, to_float32
from .kv_pool import TOKEN_HASH_SEED, KvPool, fetch_kv_pool, token_hash
from .publish import ALIGNMENT, CommitReport, Publication, publish

__version__ = "0.1.0"


def bind_module(module, tensors, **kwargs):
    """See wsup_client.torch_bind.bind_module (imports torch)."""
    from .torch_bind import bind_module as _bind
    return _bind(module, tensors, **kwargs)


__all__ = [
    "arm_death_word", "make_death_word", "read_death_word", "DEATH_WORD_BYTES", "DEATH_WORD_OFFSET",
    "FUTEX_OWNER_DIED", "FUTEX_TID_MASK", "FUTEX_WAITERS", "attach", "Attachment", "TensorInfo", "bind_module", "publish", "Publication", "CommitReport", "ALIGNMENT", "load_library", "library_version", "candidate_paths",
    "to_float32", "dequantize_block_fp8", "dequantize_checkpoint", "WsupError", "LibraryNotFoundError",
    "UnknownTensorError", "fetch_kv_pool", "KvPool", "token_hash", "TOKEN_HASH_SEED",
    "DTYPES", "MODES", "ENV_VAR", "LIB_NAME", "CODE_NAMES", "OK", "INVALID_ARGUMENT", "NOT_FOUND", "IO",
    "CORRUPT", "REFUSED", "MISMATCH", "TIMEOUT", "UNAVAILABLE", "INTERNAL", "__version__",
]
