#!/usr/bin/env python3
"""wsup-transformers-example: an example engine for the wsup supervisor, a
small OpenAI-compatible server over Hugging Face transformers (model.py),
on the standard library's threaded HTTP server (http_handler.py).

It answers what the supervisor, its probes and the front ask of an engine,
in the reference engine's words (engine/engine_server.h):

  POST /v1/completions  prompt (a string, or a list of token ids), max_tokens,
                        temperature (0: greedy), seed, stream (server-sent
                        events, then `data: [DONE]`), return_token_ids,
                        stream_options.include_usage (api.py)
  GET  /health          liveness: {"status": "ok", "state": ...}
  GET  /wsup/status     state (starting | ready | stopping), nonce, weights
                        {mode, layout, source "published" | "holder" | "disk",
                        miss_reason, diffs, ms, attach_ms, load_ms, bytes},
                        phases, requests counters
  GET  /v1/models

/wsup/status is the supervisor's: when the supervisor gave this engine a
control token ($WSUP_CONTROL_TOKEN, never a flag: a command line is visible
to every user), it answers only a request that carries
"Authorization: Bearer TOKEN", and 401 otherwise (http/control_auth.h in
the reference engine).

Life:
- The socket is bound first; stdout gets "listening on HOST:PORT" at once,
  and /health and /wsup/status answer (state "starting") while the model
  loads on a thread. Once it is loaded and warmed up, the state is "ready"
  and --ready-fd gets the same line (then is closed).
- Requests: one thread per connection (at most --max-connections), at most
  --max-active generations at once, --max-waiting more waiting for a turn
  (up to --queue-timeout-ms), more get 503 with Retry-After. Bad requests
  get 400 naming the field and what to send; a body past --max-body-bytes
  413; a wrong method 405; an unknown route 404.
- A client that goes away (its connection closes, errs or sends EOF while
  its request runs) stops its generation at the next token and frees its KV
  cache; nothing is answered.
- SIGTERM or SIGINT: the listening socket closes (new connections are
  refused), requests on open connections get 503 "stopping", requests in
  flight finish for up to --drain-timeout-ms; then those still running are
  cut (a stream ends without `data: [DONE]`, so the front resumes it on the
  other engine) and the process exits 0.

Exit codes: 0 after SIGTERM/SIGINT; 1 a failure a retry may cure (I/O, a
holder that is not there in daemon mode); 2 a usage error; 78 a permanent
refusal (a fingerprint mismatch in daemon mode, weights that do not fit the
model): the supervisor does not restart an engine that exits with it.

--model-impl fake is FOR TESTS: a deterministic token generator
(fake_model.py), so CI runs all of the above without torch.
"""

import argparse
import logging
import os
import signal
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from http_handler import ENGINE_NAME, VERSION, Server  # noqa: E402


EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_REFUSED = 78

WAKE_STARTUP_FAILED = b"\xff"  # on the wakeup pipe, beside signal numbers

log = logging.getLogger(ENGINE_NAME)


# ---------------------------------------------------------------- options


def parse_args(argv):
    p = argparse.ArgumentParser(prog="server.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the Hugging Face model folder")
    p.add_argument("--model-name", default="", help="name served as 'model' (default: the folder's name)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=0, help="port; 0 picks a free one (printed as 'listening on H:P')")
    p.add_argument("--weight-cache", default="off", choices=("daemon", "client", "off"),
                   help="daemon: the holder must serve the weights; client: use it when it has them, else "
                        "load from disk; off: load from disk")
    p.add_argument("--socket", default="", help="the holder's socket ({socket})")
    p.add_argument("--layout", default="checkpoint", choices=("checkpoint", "engine"),
                   help="checkpoint: bind the holder's checkpoint tensors; engine: attach this engine's own "
                        "layout, publishing it when nobody has ({layout})")
    p.add_argument("--backend", default="", choices=("", "host", "cuda"),
                   help="where the holder keeps weights ({backend}); default: cuda for a GPU, host for cpu")
    p.add_argument("--device", default="cpu", help="cpu | cuda:N | N (a GPU ordinal, as {devices} gives it)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="compute dtype; auto: the checkpoint's")
    p.add_argument("--revision", default="", help="revision label, as given to the holder ({revision})")
    p.add_argument("--ready-fd", type=int, default=-1, help="fd that gets 'listening on HOST:PORT' once ready")
    p.add_argument("--nonce", default=os.environ.get("WSUP_ENGINE_NONCE", ""),
                   help="identity echoed in /wsup/status (default: $WSUP_ENGINE_NONCE)")
    p.add_argument("--max-active", type=int, default=8, help="generations running at once")
    p.add_argument("--max-waiting", type=int, default=64, help="requests waiting for a turn; more get 503")
    p.add_argument("--queue-timeout-ms", type=int, default=30000, help="longest wait for a turn")
    p.add_argument("--max-connections", type=int, default=256, help="open client connections")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body")
    p.add_argument("--idle-timeout-ms", type=int, default=60000,
                   help="a connection silent this long (between requests, or a client that stops reading) "
                        "is closed")
    p.add_argument("--drain-timeout-ms", type=int, default=5000,
                   help="SIGTERM: how long requests in flight may finish (keep it below the supervisor's "
                        "engine.stop_timeout_ms)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--model-impl", default="transformers", choices=("transformers", "fake"),
                   help="fake: FOR TESTS, a deterministic token generator without torch")
    p.add_argument("--fake-vocab", type=int, default=256, help=argparse.SUPPRESS)
    p.add_argument("--fake-context", type=int, default=2048, help=argparse.SUPPRESS)
    p.add_argument("--fake-eos", type=int, action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--fake-token-delay-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--fake-load-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def validate(o):
    """A usage error naming the flag and what to pass instead, or None."""
    if not 0 <= o.port <= 65535:
        return "--port %d is out of range; pass 0 to 65535 (0 picks a free port)" % o.port
    if o.weight_cache != "off" and not o.socket:
        return "--weight-cache %s needs --socket PATH (the holder's socket)" % o.weight_cache
    if o.layout == "engine" and o.weight_cache == "off":
        return ("--layout engine publishes to or attaches from a holder: pass --weight-cache client or daemon "
                "with --socket, or drop --layout engine")
    if o.device == "cpu":
        device_is_gpu = False
    else:
        n = o.device[5:] if o.device.startswith("cuda:") else o.device
        if not (n.isdigit() and len(n) <= 4):
            return "--device %r is not one of cpu, cuda:N, N (a GPU ordinal)" % o.device
        device_is_gpu = True
    if not o.backend:
        o.backend = "cuda" if device_is_gpu else "host"
    if o.backend == "cuda" and not device_is_gpu:
        return "--backend cuda keeps weights in GPU memory: pass --device cuda:N, or --backend host"
    if o.backend == "host" and device_is_gpu and o.weight_cache != "off":
        return ("--backend host keeps weights in host memory, which a model on %s cannot compute from: pass "
                "--backend cuda, or --device cpu" % o.device)
    if o.model_impl == "fake":
        if o.layout == "engine":
            return "--model-impl fake makes no engine-made layouts; use --layout checkpoint"
        if o.device != "cpu":
            return "--model-impl fake runs on the CPU only; pass --device cpu"
        if not 1 <= o.fake_vocab <= 1 << 20 or not 2 <= o.fake_context <= 1 << 20:
            return "--fake-vocab must be 1 to 1048576 and --fake-context 2 to 1048576"
    for flag, v, lo in (("--max-active", o.max_active, 1), ("--max-waiting", o.max_waiting, 0),
                        ("--queue-timeout-ms", o.queue_timeout_ms, 0), ("--max-connections", o.max_connections, 1),
                        ("--max-body-bytes", o.max_body_bytes, 1), ("--idle-timeout-ms", o.idle_timeout_ms, 1),
                        ("--drain-timeout-ms", o.drain_timeout_ms, 0)):
        if v < lo:
            return "%s %d is out of range; pass at least %d" % (flag, v, lo)
    return None


def import_wsup_client():
    """The Python client: installed, or from this repository's
    client/python when the engine runs from a checkout."""
    try:
        import wsup_client
    except ImportError:
        sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "client", "python")))
        import wsup_client
    return wsup_client


def arm_death_word():
    """Arms the death word the supervisor gave (WSUP_DEATH_FD), first of
    all, so that the supervisor sees this process's death at the kill, not
    after its teardown. Without one, or without the client library, the
    engine goes on: its death is then seen through its lifeline."""
    if "WSUP_DEATH_FD" not in os.environ:
        return "absent"
    try:
        return "armed" if import_wsup_client().arm_death_word() else "absent"
    except Exception as e:  # the library missing, or a bad variable: said, never fatal
        log.warning("%s; the supervisor will see this engine's death through its lifeline only", e)
        return str(e)


def exit_code_for(e):
    """0-1-2-78 for an exception raised while loading."""
    code = getattr(e, "exit_code", None)
    if isinstance(code, int):
        return code
    name = getattr(e, "code_name", None)  # a wsup_client.WsupError
    if name in ("mismatch", "refused", "corrupt", "not_found"):
        return EXIT_REFUSED
    if name == "invalid_argument":
        return EXIT_REFUSED if type(e).__name__ == "BindError" else EXIT_USAGE
    return EXIT_FAILURE


# ---------------------------------------------------------------- engine


class Admission:
    """At most max_active generations; up to max_waiting more wait for a
    turn. Waiters are woken in no particular order."""

    def __init__(self, max_active, max_waiting):
        self.max_active = max_active
        self.max_waiting = max_waiting
        self.active = 0
        self.waiting = 0
        self._cond = threading.Condition()

    def enter(self, gone, timeout_s, stopping):
        """"ok" (call leave() after), "busy", "timeout", "gone" or "stopping"."""
        with self._cond:
            if self.active < self.max_active and self.waiting == 0:
                self.active += 1
                return "ok"
            if self.waiting >= self.max_waiting:
                return "busy"
            self.waiting += 1
            deadline = time.monotonic() + timeout_s
            try:
                while True:
                    if stopping():
                        return "stopping"
                    if self.active < self.max_active:
                        self.active += 1
                        return "ok"
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return "timeout"
                    # Woken by leave(); the bound is for noticing a client that left.
                    self._cond.wait(min(left, 0.05))
                    if gone():
                        return "gone"
            finally:
                self.waiting -= 1

    def leave(self):
        with self._cond:
            self.active -= 1
            self._cond.notify()


class Engine:
    """The engine's state, shared by the HTTP threads, the loader and the
    main thread (which handles signals). Fields under _lock."""

    def __init__(self, opts):
        self.opts = opts
        # The supervisor's secret for /wsup/status (see the module's doc).
        self.control_token = os.environ.get("WSUP_CONTROL_TOKEN", "")
        self.model = None
        self.state = "starting"
        self.phases = []
        self.weights = {"mode": opts.weight_cache, "layout": opts.layout}
        self.death_word = "absent"  # "armed", "absent" or what went wrong (arm_death_word)
        self.admission = Admission(opts.max_active, opts.max_waiting)
        self.hard_stop = threading.Event()  # the drain's end: cut what still runs
        self.port = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._inflight = 0
        self.counters = {"finished": 0, "cancelled": 0, "failed": 0, "cut": 0, "rejected_busy": 0,
                         "rejected_stopping": 0, "bad_requests": 0, "generated_tokens": 0}

    def count(self, key, n=1):
        with self._lock:
            self.counters[key] += n

    def set_ready(self, model):
        with self._lock:
            self.model = model
            self.weights = dict(model.weights)
            self.phases = list(model.phases)
            if self.state == "starting":
                self.state = "ready"

    def begin_stop(self):
        with self._lock:
            self.state = "stopping"

    def stopping(self):
        return self.state == "stopping"

    def enter_request(self):
        with self._lock:
            self._inflight += 1

    def leave_request(self):
        with self._lock:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.notify_all()

    def wait_idle(self, timeout_s):
        """True once no completion is in flight; False at the deadline."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._inflight > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

    def inflight(self):
        with self._lock:
            return self._inflight

    def status(self):
        o = self.opts
        with self._lock:
            m = self.model
            j = {
                "state": self.state,
                "engine": {"name": ENGINE_NAME, "version": VERSION, "impl": o.model_impl},
                "model": (m.name if m else (o.model_name or os.path.basename(os.path.normpath(o.model)))),
                "model_dir": o.model,
                "device": o.device,
                "tp": 1,
                "weights": dict(self.weights),
                "phases": {name: ms for name, ms, _ in self.phases},
                "phase_notes": {name: note for name, _, note in self.phases if note},
                # One process on one device: no collective to keep warm.
                "comm": {"kind": "none", "ranks": 1, "warm": self.state == "ready", "last_keepalive_ms": 0},
                "requests": dict(self.counters, active=self.admission.active, waiting=self.admission.waiting,
                                 inflight=self._inflight),
            }
            if o.nonce:
                j["nonce"] = o.nonce
            j["death_word"] = self.death_word
            if m is not None:
                j["limits"] = {"vocab": m.vocab_size, "context": m.context, "max_active": o.max_active,
                               "max_waiting": o.max_waiting}
                j["tokenizer"] = m.tokenizer.name
        return j


def load_model(opts):
    if opts.model_impl == "fake":
        from fake_model import FakeModel
        return FakeModel(opts, client_loader=import_wsup_client)
    import model
    return model.TransformersModel(opts, client_loader=import_wsup_client)


def _startup(engine, opts, wake_fd, result):
    t0 = time.monotonic()
    try:
        m = load_model(opts)
    except BaseException as e:  # noqa: B902 - every failure ends the start with its exit code
        result["code"] = exit_code_for(e)
        result["error"] = str(e) or type(e).__name__
        if result["code"] == EXIT_FAILURE:
            result["trace"] = traceback.format_exc()
        os.write(wake_fd, WAKE_STARTUP_FAILED)
        return
    engine.set_ready(m)
    if engine.state != "ready":
        return  # a SIGTERM came first
    lines = ["startup phases:"]
    total = 0.0
    for name, ms, note in m.phases:
        lines.append("  %-14s %8.1f ms  %s" % (name, ms, note))
        total += ms
    lines.append("  %-14s %8.1f ms  (wall %.1f ms)" % ("total", total, (time.monotonic() - t0) * 1000.0))
    print("\n".join(lines), flush=True)
    print("ready: serving %s (weights: %s)" % (m.name, m.weights.get("source")), flush=True)
    if opts.ready_fd >= 0:
        line = "listening on %s:%d\n" % (opts.host, engine.port)
        try:
            os.write(opts.ready_fd, line.encode())
            os.close(opts.ready_fd)
        except OSError as e:
            log.warning("--ready-fd %d: %s", opts.ready_fd, e)


def main(argv=None):
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, opts.log_level.upper()),
                        format="%(asctime)s %(levelname)s " + ENGINE_NAME + ": %(message)s")
    err = validate(opts)
    if err:
        print(ENGINE_NAME + ": " + err, file=sys.stderr)
        return EXIT_USAGE

    # Signals and the loader's failure both wake the main thread through one
    # pipe. A signal may be delivered to any thread, and only that thread's
    # system call is interrupted, so the main thread cannot wait for it in
    # a read of its own: the interpreter's C handler writes the signal's
    # number to the wakeup fd from whichever thread took it.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # replaces the default action; the wakeup fd carries it

    engine = Engine(opts)
    engine.death_word = arm_death_word()
    try:
        httpd = Server((opts.host, opts.port), engine)
    except OSError as e:
        print("%s: cannot listen on %s:%d: %s; pick another --port" % (ENGINE_NAME, opts.host, opts.port, e),
              file=sys.stderr)
        return EXIT_FAILURE
    engine.port = httpd.server_address[1]
    print("listening on %s:%d" % (opts.host, engine.port), flush=True)
    log.info("model %s from %s: loading (impl %s, weight cache %s, layout %s, device %s)", opts.model_name or
             os.path.basename(os.path.normpath(opts.model)), opts.model, opts.model_impl, opts.weight_cache,
             opts.layout, opts.device)
    serve = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="http", daemon=True)
    serve.start()
    result = {}
    threading.Thread(target=_startup, args=(engine, opts, wake_w, result), name="startup", daemon=True).start()

    while True:
        what = os.read(wake_r, 1)
        if what == WAKE_STARTUP_FAILED:
            print("%s: startup failed: %s" % (ENGINE_NAME, result["error"]), file=sys.stderr)
            if "trace" in result:
                log.debug("%s", result["trace"])
            code = result["code"]
            break
        if what and what[0] in (signal.SIGTERM, signal.SIGINT):
            log.info("signal %d: shutting down", what[0])
            code = drain(engine, httpd, opts)
            break
    sys.stdout.flush()
    sys.stderr.flush()
    # Handler threads may sit in a model forward; the process ends without
    # waiting for them (they hold nothing that must be written).
    os._exit(code)


def drain(engine, httpd, opts):
    """SIGTERM: stop accepting, let requests in flight finish within the
    bound, cut the rest; exit code 0."""
    engine.begin_stop()
    httpd.shutdown()      # the accept loop ends
    httpd.socket.close()  # new connections are refused, not queued
    n = engine.inflight()
    log.info("stopping: %d request(s) in flight may finish for %d ms", n, opts.drain_timeout_ms)
    if not engine.wait_idle(opts.drain_timeout_ms / 1000.0):
        log.warning("%d request(s) still running after --drain-timeout-ms %d: cutting them", engine.inflight(),
                    opts.drain_timeout_ms)
        engine.hard_stop.set()
        # Each notices at its next token; one forward is the longest wait.
        engine.wait_idle(10.0)
    log.info("stopped: %d finished, %d cut", engine.counters["finished"], engine.counters["cut"])
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
