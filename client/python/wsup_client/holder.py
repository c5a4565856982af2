"""Starting a wsup-holder as a child process, for tests and tools (on a node
the supervisor starts holders). Readiness is the holder's own "ready
<socket>" line on an inherited pipe (--ready-fd), polled with a deadline.
"""

import os
import select
import signal
import subprocess
import time


class HolderProcess:
    """A running wsup-holder: .proc (subprocess.Popen), .socket, .log_path.
    stop() (or leaving a `with` block) SIGKILLs and reaps it if it runs."""

    def __init__(self, proc, socket_path, log_path):
        self.proc = proc
        self.socket = socket_path
        self.log_path = log_path

    def log(self):
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def running(self):
        return self.proc.poll() is None

    def kill(self, sig=signal.SIGKILL, timeout_s=30):
        """Sends `sig` and waits (bounded) for the exit; returns the exit status."""
        if self.running():
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout_s)

    def stop(self):
        if self.running():
            self.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_holder(binary, model, socket_dir, args=(), name="holder", timeout_s=60.0, env=None):
    """Starts `binary --socket socket_dir/NAME.sock --model model ARGS` and
    waits until it writes its ready line. Raises RuntimeError with the
    holder's log when it exits or the deadline passes first."""
    socket_path = os.path.join(socket_dir, name + ".sock")
    log_path = os.path.join(socket_dir, name + ".log")
    r, w = os.pipe()
    try:
        argv = [binary, "--socket", socket_path, "--ready-fd", str(w)]
        if model is not None:
            argv += ["--model", str(model)]
        argv += [str(a) for a in args]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    pass_fds=(w,), env=env, start_new_session=True)
    finally:
        os.close(w)
    h = HolderProcess(proc, socket_path, log_path)
    want = ("ready " + socket_path + "\n").encode()
    got = b""
    deadline = time.monotonic() + timeout_s
    try:
        while b"\n" not in got:
            left = deadline - time.monotonic()
            if left <= 0:
                h.stop()
                raise RuntimeError("%s did not report ready within %.0f s; its log:\n%s" % (binary, timeout_s, h.log()))
            ready, _, _ = select.select([r], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(r, 256)
                if not chunk:  # every writer closed: the holder exited
                    break
                got += chunk
            elif not h.running():
                break
    finally:
        os.close(r)
    if got != want:
        h.stop()
        raise RuntimeError("%s exited or wrote %r instead of its ready line; exit status %s; its log:\n%s" %
                           (binary, got, h.proc.poll(), h.log()))
    return h
