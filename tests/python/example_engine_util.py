"""Helpers for the tests of the example engine (examples/transformers_engine):
starting it as a real process, speaking HTTP to it, and running a whole wsup
node whose engines it is. Used by test_example_engine*.py and by
gpu_example_engine_check.py; no pytest here.

Every wait is a poll of a condition with a deadline (wait_for); every
process started is ended by its owner's stop(), whether the test passed or
not.
"""

import http.client
import json
import os
import select
import signal
import socket
import struct
import sqlite3
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
EXAMPLE_DIR = os.path.join(ROOT, "examples", "transformers_engine")
SERVER = os.path.join(EXAMPLE_DIR, "server.py")
CONFIG = os.path.join(EXAMPLE_DIR, "wsup.toml")


def wait_for(cond, timeout_s, step_s=0.01):
    """Polls cond() until it is true or timeout_s passes; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(step_s)


def read_ready_line(fd, proc, timeout_s):
    """What the process writes on the --ready-fd pipe up to its newline (or
    b"" if it exits first / the deadline passes)."""
    got = b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in got:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], min(left, 0.2))
        if ready:
            chunk = os.read(fd, 256)
            if not chunk:
                break
            got += chunk
        elif proc.poll() is not None:
            break
    return got


class EngineProcess:
    """A running example engine: .proc, .port, .out_path / .err_path."""

    def __init__(self, proc, port, out_path, err_path):
        self.proc = proc
        self.port = port
        self.out_path = out_path
        self.err_path = err_path

    def output(self):
        out = []
        for p in (self.out_path, self.err_path):
            try:
                with open(p, errors="replace") as f:
                    out.append(f.read())
            except OSError:
                pass
        return "\n".join(out)

    def running(self):
        return self.proc.poll() is None

    def signal(self, sig):
        if self.running():
            self.proc.send_signal(sig)

    def wait(self, timeout_s=30):
        """The exit status, or None at the deadline."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        if self.running():
            self.proc.kill()
        self.proc.wait(timeout=30)


def start_engine(args, workdir, name="engine", env=None, wait_ready=True, timeout_s=60.0, python=None):
    """Starts server.py ARGS (add --model-impl fake for CI) on port 0 with
    --ready-fd; returns an EngineProcess once it announced readiness (or,
    with wait_ready False, once it printed its port). Raises RuntimeError
    with its output when it exits or the deadline passes first."""
    out_path = os.path.join(workdir, name + ".out")
    err_path = os.path.join(workdir, name + ".err")
    r, w = os.pipe()
    full_env = dict(os.environ if env is None else env)
    full_env["PYTHONUNBUFFERED"] = "1"
    try:
        argv = [python or sys.executable, SERVER, "--port", "0", "--ready-fd", str(w)] + [str(a) for a in args]
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, pass_fds=(w,),
                                    env=full_env, start_new_session=True)
    finally:
        os.close(w)
    e = EngineProcess(proc, 0, out_path, err_path)
    try:
        def port_printed():
            try:
                with open(out_path) as f:
                    for line in f:
                        if line.startswith("listening on "):
                            return int(line.strip().rsplit(":", 1)[1])
            except (OSError, ValueError):
                pass
            return 0 if e.running() else -1

        port = wait_for(lambda: port_printed() != 0, timeout_s) and port_printed()
        if not port or port < 0:
            e.stop()
            raise RuntimeError("the example engine did not print its port; exit %s; output:\n%s" %
                               (proc.poll(), e.output()))
        e.port = port
        if wait_ready:
            line = read_ready_line(r, proc, timeout_s)
            if line != ("listening on 127.0.0.1:%d\n" % port).encode():
                e.stop()
                raise RuntimeError("the example engine wrote %r instead of its ready line; exit %s; output:\n%s" %
                                   (line, proc.poll(), e.output()))
    finally:
        os.close(r)
    return e


# ---------------------------------------------------------------- HTTP


def request(port, method, path, body=None, headers=None, timeout_s=30.0, host="127.0.0.1"):
    """(status, headers as a dict of lower-case names, body bytes)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        data = body if body is None or isinstance(body, bytes) else (
            body.encode() if isinstance(body, str) else json.dumps(body).encode())
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def get_json(port, path, timeout_s=10.0, token=None):
    headers = {"Authorization": "Bearer " + token} if token else None
    status, _, body = request(port, "GET", path, headers=headers, timeout_s=timeout_s)
    if status != 200:
        raise RuntimeError("GET %s on port %d: %d %r" % (path, port, status, body[:300]))
    return json.loads(body)


def try_status(port, token=None):
    """An engine's /wsup/status; `token`: the control token a supervisor gave it (Node.engine_token)."""
    try:
        return get_json(port, "/wsup/status", timeout_s=5.0, token=token)
    except (OSError, RuntimeError, ValueError):
        return None


def complete(port, prompt, max_tokens=16, **extra):
    """A non-streamed greedy completion: (status, parsed JSON or body bytes)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True}
    body.update(extra)
    status, _, data = request(port, "POST", "/v1/completions", body)
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data


class EventStream:
    """A streamed completion read event by event: events() yields each
    `data:` payload (parsed JSON, or the string "[DONE]"); `ended_clean` is
    True when the body ended after [DONE] with its last chunk."""

    def __init__(self, port, body, timeout_s=30.0, host="127.0.0.1", path="/v1/completions"):
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
        self.conn.request("POST", path, body=json.dumps(body).encode(),
                          headers={"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.headers = {k.lower(): v for k, v in self.resp.getheaders()}
        self.ended_clean = False

    def events(self):
        try:
            while True:
                line = self.resp.readline()
                if not line:
                    return
                line = line.decode("utf-8").rstrip("\r\n")
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    # The event's blank line, then the last chunk: a body cut
                    # before it raises IncompleteRead instead.
                    rest = self.resp.read()
                    self.ended_clean = rest.strip() == b""
                    yield data
                    return
                yield json.loads(data)
        except (http.client.IncompleteRead, OSError):
            return

    def close(self):
        self.conn.close()


def stream_tokens(events):
    """(token ids, finish_reason, saw [DONE]) of a list of events."""
    ids, finish, done = [], None, False
    for e in events:
        if e == "[DONE]":
            done = True
            continue
        for c in e.get("choices", []):
            ids.extend(c.get("token_ids", []))
            if c.get("finish_reason"):
                finish = c["finish_reason"]
    return ids, finish, done


# ---------------------------------------------------------------- a node


def tagged_pids(tag_value, tag="WSUP_TEST_NODE"):
    """Pids of live processes whose environment holds TAG=tag_value."""
    want = ("%s=%s" % (tag, tag_value)).encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if want in env:
            out.append(int(d))
    return out


class Node:
    """`wsup start CONFIG --set ...` in a temporary directory, with every
    process of the node tagged WSUP_TEST_NODE=<dir> (the supervisor passes its
    environment on), so stop() ends whatever is left, whatever the test did."""

    def __init__(self, bin_dir, config, sets, workdir, env=None):
        self.bin_dir = bin_dir
        self.wsup = os.path.join(bin_dir, "wsup")
        self.config = config
        self.dir = workdir
        self.sets = ["node.state_dir=" + os.path.join(workdir, "state"),
                     "node.runtime_dir=" + os.path.join(workdir, "run")] + list(sets)
        self.env = dict(os.environ if env is None else env)
        self.env["WSUP_TEST_NODE"] = workdir
        self.env["PYTHONUNBUFFERED"] = "1"
        self.proc = None
        self.log_path = os.path.join(workdir, "supervisor.log")

    @property
    def sock(self):
        return os.path.join(self.dir, "run", "wsup.sock")

    def front_status(self, timeout_s=10.0):
        """The front's status (its control socket, run/front.sock): frames of a
        4-byte little-endian length and one JSON object (wire/json_frame.h);
        the events it pushes to every client are skipped."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(os.path.join(self.dir, "run", "front.sock"))
            body = json.dumps({"type": "status"}).encode()
            s.sendall(struct.pack("<I", len(body)) + body)
            buf = b""
            while True:
                while len(buf) < 4 or len(buf) < 4 + struct.unpack("<I", buf[:4])[0]:
                    more = s.recv(1 << 16)
                    if not more:
                        raise OSError("the front closed its control socket before answering")
                    buf += more
                n = struct.unpack("<I", buf[:4])[0]
                msg = json.loads(buf[4:4 + n])
                buf = buf[4 + n:]
                if msg.get("type") != "event":
                    return msg

    @property
    def db(self):
        return os.path.join(self.dir, "state", "wsup.db")

    def argv(self, cmd):
        a = [self.wsup, cmd, self.config]
        for s in self.sets:
            a += ["--set", s]
        return a

    def check(self, extra=(), no_paths=False):
        a = self.argv("check") + list(extra) + (["--no-paths"] if no_paths else [])
        r = subprocess.run(a, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60, env=self.env)
        return r.returncode, r.stdout.decode(errors="replace")

    def start(self):
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.argv("start"), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=self.env, start_new_session=True)

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def engine_log(self, slot):
        try:
            with open(os.path.join(self.dir, "state", "logs", "engine-%s.log" % slot), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def cli(self, *args, timeout_s=90):
        r = subprocess.run([self.wsup] + list(args) + ["--socket", self.sock], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout_s, env=self.env)
        return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")

    def engine_token(self, slot):
        """The control token the supervisor gave the engine of `slot` (from its 0600 state.json), or None."""
        try:
            with open(os.path.join(self.dir, "run", "state.json")) as f:
                state = json.load(f)
        except (OSError, ValueError):
            return None
        for e in state.get("engines", []):
            if e.get("slot") == slot:
                return e.get("control_token") or None
        return None

    def status(self):
        if not os.path.exists(self.sock):
            return None
        try:
            rc, out, _ = self.cli("status", "--json", timeout_s=20)
        except subprocess.TimeoutExpired:
            return None
        if rc != 0:
            return None
        try:
            return json.loads(out)
        except ValueError:
            return None

    @staticmethod
    def serving(s):
        if not s or s.get("state") != "serving":
            return False
        ready = [e for e in s.get("engines", []) if e.get("semantic_ready") and e.get("role") in ("active", "standby")]
        return len(ready) == 2

    def wait_serving(self, timeout_s):
        return wait_for(lambda: self.serving(self.status()), timeout_s, step_s=0.05)

    def engine(self, s, role):
        for e in s.get("engines", []):
            if e.get("role") == role:
                return e
        return None

    def front_port(self, s=None):
        s = s or self.status()
        return int(s["front"]["listen"].rsplit(":", 1)[1])

    def query(self, sql):
        """Rows of the ledger as dicts (read-only; the ledger is in WAL mode)."""
        conn = sqlite3.connect("file:%s?mode=ro" % self.db, uri=True, timeout=5)
        try:
            conn.row_factory = sqlite3.Row
            return [dict(r) for r in conn.execute(sql).fetchall()]
        except sqlite3.Error:
            return []
        finally:
            conn.close()

    def stop(self, timeout_s=60):
        """`wsup stop`, then the supervisor's exit status (None if it had to be killed)."""
        code = None
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.cli("stop", timeout_s=timeout_s)
                code = self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                code = None
        elif self.proc is not None:
            code = self.proc.returncode
        return code

    def cleanup(self):
        """Ends everything of this node still running (by pid, SIGKILL)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        for pid in tagged_pids(self.dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        wait_for(lambda: not tagged_pids(self.dir), 10)


def free_port_refused(port):
    """True when nothing accepts on 127.0.0.1:port."""
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
        return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        s.close()
