"""The death word: let the supervisor see this engine's death at the kill.

    import wsup_client
    wsup_client.arm_death_word()   # early, before loading; True when armed

A supervisor that starts an engine passes it a one-page shared memory file
and names it in WSUP_DEATH_FD. Arming it starts one thread (in the client
library) that owns a robust futex in that page and sleeps for ever; the
kernel marks the futex as that thread exits, which it does only when the
whole process dies, and the supervisor moves the traffic then, instead of
after the kernel has torn the process down (docs/architecture.md, "Crash of
the active engine"). Without it the engine still works: its death is seen
through its lifeline, a little later.
"""

import ctypes
import os
import struct

from ._errors import WsupError
from ._lib import load_library

# The page's layout (wire/death_word.h), for a supervisor, a test or a
# benchmark written in Python that makes the page and watches it: four
# native-endian uint32 (magic, version, the futex word, the armed pid), then
# zeros to the page's end.
DEATH_WORD_MAGIC = 0x57534457
DEATH_WORD_VERSION = 1
DEATH_WORD_BYTES = 4096
DEATH_WORD_OFFSET = 8          # the futex word: the owner's tid, and the kernel's flags
DEATH_WORD_PID_OFFSET = 12     # the process that armed it
FUTEX_WAITERS = 0x80000000
FUTEX_OWNER_DIED = 0x40000000  # set by the kernel when the owner thread exits
FUTEX_TID_MASK = 0x3FFFFFFF


def make_death_word(name="wsup-death-word"):
    """A fresh page as a supervisor makes it, unarmed: an fd to pass to the
    engine (as WSUP_DEATH_FD) and to watch. The caller closes it."""
    fd = os.memfd_create(name)
    try:
        os.ftruncate(fd, DEATH_WORD_BYTES)
        os.pwrite(fd, struct.pack("=IIII", DEATH_WORD_MAGIC, DEATH_WORD_VERSION, 0, 0), 0)
    except OSError:
        os.close(fd)
        raise
    return fd


def read_death_word(fd):
    """(word, pid) of a page: word & FUTEX_OWNER_DIED once its owner died;
    word & FUTEX_TID_MASK is the owner's tid (0: never armed)."""
    return struct.unpack("=II", os.pread(fd, 8, DEATH_WORD_OFFSET))


def arm_death_word(library=None):
    """Arms WSUP_DEATH_FD's death word. Returns True when armed, False when
    the variable is unset; raises WsupError (naming the variable and the fix)
    when it names something that is not a death word."""
    _, lib = load_library(library)
    err = ctypes.create_string_buffer(1024)
    rc = lib.wsup_arm_death_word(err, len(err))
    if rc == 1:
        return True
    if rc == 0:
        return False
    raise WsupError(err.value.decode("utf-8", "replace"), -rc)
