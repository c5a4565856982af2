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

from ._errors import WsupError
from ._lib import load_library


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
