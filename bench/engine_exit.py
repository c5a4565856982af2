#!/usr/bin/env python3
"""How soon a SIGKILLed engine's death can be seen, four ways.

A killed process is torn down by the kernel in order: its memory first, then
its file descriptors from the lowest number up, then it becomes a zombie
that its parent can reap. For an engine that holds large host mappings or
a GPU context, each step can take tens of milliseconds, and where a watcher
looks decides how soon it knows:
  - pipe: the write end of a pipe inherited at a low fd (opened before the
    engine touched the GPU): EOF when that fd is closed;
  - conn: an idle keep-alive HTTP connection the engine accepted after it
    was ready (a higher fd): EOF or reset when it is closed;
  - exit: pidfd readable / waitpid, once the process has exited;
  - word: the engine's death word (wire/death_word.h), a futex the kernel
    marks as the engine's owning thread exits, before any of the above.
Repeats N times and prints the medians, in ms after the kill.

  bench/engine_exit.py --engine build/bin/wsup-engine --model DIR [--device cuda:0] [--runs 5]
"""
import argparse
import ctypes
import json
import mmap
import os
import struct
import threading
import select
import signal
import socket
import statistics
import subprocess
import sys
import time


# The death word's page layout, from the project's Python client (no library
# needed for it).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))
from wsup_client.death_word import (DEATH_WORD_BYTES, DEATH_WORD_OFFSET, FUTEX_OWNER_DIED,  # noqa: E402
                                    FUTEX_TID_MASK, FUTEX_WAITERS, make_death_word)

LIBC = ctypes.CDLL(None, use_errno=True)
SYS_FUTEX = 202  # x86_64
FUTEX_WAIT = 0


def death_word():
    """A fresh death word page, as the supervisor makes it."""
    fd = make_death_word("bench-death-word")
    page = mmap.mmap(fd, DEATH_WORD_BYTES)
    return fd, page


def watch_word(page, t0_box, seen):
    """Sleeps on the word until the kernel marks its owner dead."""
    word = ctypes.c_uint32.from_buffer(page, DEATH_WORD_OFFSET)
    while True:
        v = word.value
        if v & FUTEX_OWNER_DIED:
            seen["word"] = (time.monotonic() - t0_box[0]) * 1000
            del word
            return
        if v & FUTEX_TID_MASK and not v & FUTEX_WAITERS:
            word.value = v | FUTEX_WAITERS  # the engine never writes it again while it lives
            continue
        LIBC.syscall(SYS_FUTEX, ctypes.byref(word), FUTEX_WAIT, ctypes.c_uint32(v), None, None, 0)


def start(engine, model, device, kv_mib, word_fd):
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    env = dict(os.environ, WSUP_DEATH_FD=str(word_fd))
    proc = subprocess.Popen(
        [engine, "--model", model, "--port", "0", "--device", device, "--weight-cache", "off",
         "--kv-cache-mib", str(kv_mib), "--ready-fd", str(ready_w)],
        pass_fds=(w, ready_w, word_fd), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(w)
    os.close(ready_w)
    line = b""
    deadline = time.time() + 300
    while not line.endswith(b"\n"):
        if time.time() > deadline or not select.select([ready_r], [], [], deadline - time.time())[0]:
            sys.exit("engine not ready in time")
        chunk = os.read(ready_r, 256)
        if not chunk:
            sys.exit("engine exited before it was ready")
        line += chunk
    os.close(ready_r)
    port = int(line.decode().strip().rsplit(":", 1)[1])
    return proc, r, port


def one(args):
    word_fd, page = death_word()
    proc, pipe_r, port = start(args.engine, args.model, args.device, args.kv_cache_mib, word_fd)
    os.close(word_fd)
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.recv(65536)  # the answer; the connection stays open (keep-alive)
    pidfd = os.pidfd_open(proc.pid)
    seen = {}
    poller = select.poll()
    poller.register(pipe_r, select.POLLIN | select.POLLHUP)
    poller.register(conn.fileno(), select.POLLIN | select.POLLHUP)
    poller.register(pidfd, select.POLLIN)
    names = {pipe_r: "pipe", conn.fileno(): "conn", pidfd: "exit"}
    t0_box = [0.0]
    watcher = threading.Thread(target=watch_word, args=(page, t0_box, seen))
    if struct.unpack_from("=I", page, DEATH_WORD_OFFSET)[0] == 0:
        sys.exit("the engine did not arm its death word (WSUP_DEATH_FD); is it a wsup-engine of this tree?")
    t0_box[0] = time.monotonic()
    watcher.start()
    t0 = t0_box[0]
    os.kill(proc.pid, signal.SIGKILL)
    while not {"pipe", "conn", "exit"} <= seen.keys():
        for fd, _ in poller.poll(10000):
            if names[fd] not in seen:
                seen[names[fd]] = (time.monotonic() - t0) * 1000
                poller.unregister(fd)
    watcher.join(10)
    proc.wait()
    page.close()
    os.close(pipe_r)
    os.close(pidfd)
    conn.close()
    return seen


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--kv-cache-mib", type=int, default=64)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", help="write the raw runs here")
    args = p.parse_args()
    runs = [one(args) for _ in range(args.runs)]
    print(f"engine death seen after SIGKILL, device {args.device}, KV cache {args.kv_cache_mib} MiB, "
          f"median of {args.runs} (min..max), ms")
    print("| watcher | ms |\n|---|---:|")
    for k, label in (("word", "death word (futex marked at the owning thread's exit)"),
                     ("pipe", "inherited pipe at a low fd: EOF"), ("conn", "accepted keep-alive connection: EOF"),
                     ("exit", "process exit (pidfd)")):
        v = [r[k] for r in runs if k in r]
        if not v:
            print(f"| {label} | not seen |")
            continue
        print(f"| {label} | {statistics.median(v):.1f} ({min(v):.1f}..{max(v):.1f}) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f)


if __name__ == "__main__":
    main()
