#!/usr/bin/env python3
"""Engine-made layouts with torch and transformers on a GPU (issue 13,
acceptance 2), no pytest needed. Every writer and reader is a process of its
own (this script with --role), driven over its stdin and stdout.

On qwen3moe-tiny-f32 (transformers 5 fuses each MoE layer's experts into
3-D gate_up_proj / down_proj at load time: memory_layout.json lists the
tensors a loaded model holds), against `wsup-holder --layout engine
--backend cuda`:
  (a) a writer publishes: inside pub.torch_pool() its own loader
      (Qwen3MoeForCausalLM.from_pretrained, device_map cuda:DEVICE) writes
      straight into the lease; it commits model.state_dict() (recorded in
      place: its parameters are the layout's tensors, at the same
      addresses) and generates the goldens itself, after the commit;
  (b) a fresh process attaches the layout, builds the model on the meta
      device and binds it (wsup_client.bind_module): the goldens, with
      torch.cuda.memory_allocated growing by less than 1% of the weights;
  (d) the writer is SIGKILLed: the reader keeps generating, and a new
      reader attaches and generates;
  (c) the holder is SIGKILLed: both readers keep their mappings and
      generate the goldens again;
  (e) a writer SIGKILLed mid-publish (loaded into its lease, not committed)
      loses the lease to a waiting writer, which publishes.
--backend host runs the same flow on a host holder (the model on the CPU;
no torch allocator there, so the commit copies every tensor into the
lease, and the GPU-only checks are skipped).

Prints a PASS/FAIL table; exits 1 if anything failed.

  python3 tests/python/gpu_layout_check.py --holder BIN_DIR/wsup-holder \\
      --lib LIB_DIR/libwsup_client.so --testdata TESTDATA_DIR [--device 0] [--backend cuda|host]
"""

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "..", "client", "python")
sys.path.insert(0, PACKAGE)
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from check_table import Table  # noqa: E402
import wsup_client as wc  # noqa: E402
from wsup_client.holder import start_holder  # noqa: E402

MODEL = "qwen3moe-tiny-f32"
ENGINE = {"name": "hf-transformers", "version": "5", "transform": "fused-experts/v1"}
STEP_S = 600  # the longest any one step of a child may take



# ---------------------------------------------------------------- the roles


def emit(**event):
    print(json.dumps(event), flush=True)


def role_setup(args):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False  # the goldens are float32
    torch.backends.cudnn.allow_tf32 = False
    cuda = args.backend == "cuda"
    device = torch.device("cuda", args.device) if cuda else torch.device("cpu")
    if cuda:
        torch.zeros(1, device=device)  # CUDA is up before anything is measured
        torch.cuda.synchronize(device)
    return torch, cuda, device


def goldens(torch, model, model_dir, device):
    with open(os.path.join(model_dir, "golden.json")) as f:
        cases = json.load(f)["cases"]
    bad = []
    for c in cases:
        ids = torch.tensor([c["prompt_ids"]], device=device)
        n = len(c["output_ids"])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, num_beams=1)
        got = out[0, len(c["prompt_ids"]):].tolist()
        if got != c["output_ids"]:
            bad.append("%r: got %s want %s" % (c["prompt"], got, c["output_ids"]))
    return {"cases": len(cases), "bad": bad}


def serve_commands(torch, model, model_dir, device):
    """Answers `generate WHEN` until `exit` (or EOF)."""
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "exit":
            return
        if words[0] == "generate":
            emit(event="generated", when=" ".join(words[1:]), **goldens(torch, model, model_dir, device))


def role_writer(args):
    torch, cuda, device = role_setup(args)
    from transformers import Qwen3MoeForCausalLM
    model_dir = os.path.join(args.testdata, args.model)
    pub = wc.publish(args.socket, "daemon", checkpoint_dir=model_dir, engine=ENGINE, backend=args.backend,
                     device=args.device, library=args.lib, client_name="layout-writer")
    emit(event="lease", has_lease=pub.has_lease, attached=pub.attached, reason=pub.reason)
    if not pub.has_lease:
        return
    t0 = time.perf_counter()
    if cuda:
        # The loader allocates inside the lease; everything else of this
        # process (goldens, CUDA graphs) allocates as usual after the block.
        with pub.torch_pool(chunk_bytes=args.chunk_bytes):
            model = Qwen3MoeForCausalLM.from_pretrained(model_dir, device_map="cuda:%d" % args.device,
                                                        dtype=torch.float32)
    else:
        model = Qwen3MoeForCausalLM.from_pretrained(model_dir, device_map="cpu", dtype=torch.float32)
    model.eval()
    load_ms = (time.perf_counter() - t0) * 1000
    granted, used, blocks = pub.usage()
    sd = model.state_dict()
    emit(event="loaded", load_ms=load_ms, names={n: [list(t.shape), str(t.dtype).replace("torch.", "")]
                                                 for n, t in sd.items()},
         granted=granted, used=used, blocks=blocks)
    if args.stop_before_commit:
        sys.stdin.read()  # until killed
        return
    att = pub.commit(sd)
    r = att.report
    same, equal = 0, 0
    for name in att.names():
        mine = sd[name]
        if mine.data_ptr() == att.data_ptr(name):
            same += 1
        if torch.equal(att.torch(name), mine):
            equal += 1
    weights = sum(att.info(n).nbytes for n in att.names())
    emit(event="committed", in_place=len(r.in_place), copied=r.copied, copied_bytes=r.copied_bytes, tied=r.tied,
         reasons=r.reasons, tensors=len(att.names()), same_address=same, equal=equal, weights=weights,
         source=att.source, **goldens(torch, model, model_dir, device))
    serve_commands(torch, model, model_dir, device)


def role_reader(args):
    torch, cuda, device = role_setup(args)
    from transformers import AutoConfig, Qwen3MoeForCausalLM
    model_dir = os.path.join(args.testdata, args.model)
    mem = (lambda: torch.cuda.memory_allocated(device)) if cuda else (lambda: 0)
    mem0 = mem()
    t0 = time.perf_counter()
    att = wc.attach(args.socket, "daemon", checkpoint_dir=model_dir, backend=args.backend, device=args.device,
                    engine=ENGINE, library=args.lib, client_name="layout-reader")
    tensors = att.tensors("torch")
    attach_ms = (time.perf_counter() - t0) * 1000
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(config)
    model.eval()
    report = wc.bind_module(model, tensors)
    grew = mem() - mem0
    params = list(model.named_parameters())
    same = sum(1 for n, p in params if n in tensors and p.data_ptr() == att.data_ptr(n))
    weights = sum(att.info(n).nbytes for n in att.names())
    emit(event="bound", source=att.source, attach_ms=attach_ms, tensors=len(tensors), params=len(params),
         same_address=same, bound=len(report.bound), materialized=report.materialized, grew=grew, weights=weights,
         **goldens(torch, model, model_dir, device))
    serve_commands(torch, model, model_dir, device)


# ---------------------------------------------------------------- the driver


class Child:
    """A role process; its events are JSON lines on its stdout."""

    def __init__(self, args, role, socket, log_dir, extra=()):
        argv = [sys.executable, os.path.abspath(__file__), "--role", role, "--socket", socket, "--testdata",
                args.testdata, "--device", str(args.device), "--backend", args.backend, "--model", args.model,
                "--chunk-bytes", str(args.chunk_bytes)] + list(extra)
        if args.lib:
            argv += ["--lib", args.lib]
        self.log_path = os.path.join(log_dir, "%s-%d.log" % (role, int(time.monotonic() * 1000)))
        self._log = open(self.log_path, "wb")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env)
        self._buf = b""

    def event(self, want, timeout_s=STEP_S):
        """The next event named `want`; RuntimeError with the log if the child
        exits or the bound passes first."""
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue  # a library printed something on stdout
                if ev.get("event") == want:
                    return ev
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError("no %r event within %d s; its log:\n%s" % (want, timeout_s, self.log()))
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    raise RuntimeError("the %s process exited (status %s) before %r; its log:\n%s" %
                                       (want, self.proc.wait(timeout=30), want, self.log()))
                self._buf += chunk

    def send(self, line):
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def log(self):
        self._log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")[-6000:]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(timeout=60)

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.send("exit")
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for f in (self.proc.stdin, self.proc.stdout, self._log):
            try:
                f.close()
            except OSError:
                pass


def golden_row(table, step, ev, when):
    bad = ev.get("bad", [])
    return table.add(step, "generate(do_sample=False) = golden output_ids, %d cases, %s" % (ev.get("cases", 0), when),
                     not bad and ev.get("cases", 0) > 0, "; ".join(bad[:2]))


def run(table, args, tmp):
    cuda = args.backend == "cuda"
    model_dir = os.path.join(args.testdata, args.model)
    with open(os.path.join(model_dir, "memory_layout.json")) as f:
        layout = json.load(f)
    holder_args = ["--layout", "engine", "--backend", args.backend, "--device", str(args.device)]
    h = start_holder(args.holder, None, tmp, args=holder_args, name="layouts", timeout_s=120)
    children = []
    try:
        # (a) the writer publishes with its own loader.
        writer = Child(args, "writer", h.socket, tmp)
        children.append(writer)
        ev = writer.event("lease")
        table.add("a", "the first writer gets the lease", ev["has_lease"] and not ev["attached"], ev.get("reason", ""))
        ev = writer.event("loaded")
        names = ev["names"]
        want = {n: [v["shape"], v["dtype"]] for n, v in layout.items()}
        table.add("a", "the loader's own state_dict is memory_layout.json (fused 3-D experts)", names == want,
                  "%d tensors, loaded in %.0f ms" % (len(names), ev["load_ms"]) if names == want else
                  "differs: %s" % sorted(set(names) ^ set(want))[:6])
        if cuda:
            table.add("a", "from_pretrained allocated inside the lease (torch_pool)", ev["used"] > 0,
                      "%d blocks, %d bytes in use of %d granted" % (ev["blocks"], ev["used"], ev["granted"]))
        ev = writer.event("committed")
        if cuda:
            table.add("a", "commit(state_dict): every tensor recorded in place, nothing copied",
                      ev["in_place"] == ev["tensors"] and not ev["copied"],
                      "%d in place, %d copied (%d bytes)%s" % (ev["in_place"], len(ev["copied"]), ev["copied_bytes"],
                                                               ": " + json.dumps(ev["reasons"])[:200]
                                                               if ev["copied"] else ""))
            table.add("a", "the writer's parameters are the committed layout's tensors (same addresses)",
                      ev["same_address"] == ev["tensors"], "%d of %d" % (ev["same_address"], ev["tensors"]))
        else:
            table.add("a", "commit(state_dict) on host: every tensor copied into the lease", ev["copied"] and
                      len(ev["copied"]) == ev["tensors"], "%d copied, %d bytes" % (len(ev["copied"]), ev["copied_bytes"]))
        table.add("a", "the layout holds the writer's bytes (torch.equal, every tensor)", ev["equal"] == ev["tensors"],
                  "%d of %d, source %s" % (ev["equal"], ev["tensors"], ev["source"]))
        golden_row(table, "a", ev, "by the writer after its commit")

        # (b) a fresh process attaches, binds a meta model, generates.
        reader = Child(args, "reader", h.socket, tmp)
        children.append(reader)
        ev = reader.event("bound")
        table.add("b", "a fresh process attaches the layout (source holder)", ev["source"] == "holder",
                  "%d tensors, %.1f ms" % (ev["tensors"], ev["attach_ms"]))
        table.add("b", "bind_module on a meta model: every parameter is the attached tensor",
                  ev["same_address"] == ev["params"] > 0,
                  "%d of %d parameters; materialized %s" % (ev["same_address"], ev["params"],
                                                            ", ".join(ev["materialized"])))
        if cuda:
            table.add("b", "torch.cuda.memory_allocated grew by less than 1% of the weights",
                      ev["grew"] < ev["weights"] / 100, "%+d bytes for %d bytes of weights" % (ev["grew"], ev["weights"]))
        golden_row(table, "b", ev, "reader")

        # (d) the writer dies: readers go on, a new one attaches.
        status = writer.kill()
        table.add("d", "the writer SIGKILLed after its commit", status == -signal.SIGKILL, "exit status %s" % status)
        reader.send("generate after the writer's SIGKILL")
        golden_row(table, "d", reader.event("generated"), "reader, writer dead")
        second = Child(args, "reader", h.socket, tmp)
        children.append(second)
        ev = second.event("bound")
        table.add("d", "a new reader attaches with the writer dead", ev["source"] == "holder" and
                  ev["same_address"] == ev["params"] > 0, "%d tensors" % ev["tensors"])
        golden_row(table, "d", ev, "new reader, writer dead")

        # (c) the holder dies: both readers keep their mappings.
        status = h.kill(signal.SIGKILL)
        table.add("c", "the holder SIGKILLed while two readers hold the layout", status == -signal.SIGKILL,
                  "exit status %s" % status)
        for who, child in (("first reader", reader), ("second reader", second)):
            child.send("generate holder dead")
            golden_row(table, "c", child.event("generated"), who + ", holder dead")
    finally:
        for c in children:
            c.stop()
        h.stop()

    # (e) a writer killed mid-publish hands the lease to the one that waits.
    h = start_holder(args.holder, None, tmp, args=holder_args, name="layouts-e", timeout_s=120)
    children = []
    try:
        doomed = Child(args, "writer", h.socket, tmp, extra=["--stop-before-commit"])
        children.append(doomed)
        table.add("e", "a writer gets the lease and loads into it", doomed.event("lease")["has_lease"] and
                  bool(doomed.event("loaded")["names"]))
        heir = Child(args, "writer", h.socket, tmp)
        children.append(heir)
        deadline = time.monotonic() + 120
        waiting = False
        while not waiting and time.monotonic() < deadline and heir.proc.poll() is None:
            waiting = _waiters(args.holder, h.socket) >= 1
            if not waiting:
                time.sleep(0.2)  # polled with a bound: the heir is still importing torch
        table.add("e", "a second writer waits for the lease", waiting)
        status = doomed.kill()
        table.add("e", "the first writer SIGKILLed before its commit", status == -signal.SIGKILL,
                  "exit status %s" % status)
        ev = heir.event("lease")
        table.add("e", "the waiting writer gets the lease", ev["has_lease"], ev.get("reason", ""))
        ev = heir.event("committed")
        table.add("e", "it publishes the layout", ev["tensors"] == len(layout) and ev["equal"] == ev["tensors"],
                  "%d tensors" % ev["tensors"])
        golden_row(table, "e", ev, "by the second writer")
    finally:
        for c in children:
            c.stop()
        h.stop()


def _waiters(holder, socket):
    """How many clients wait for a layout on the holder at `socket`
    (`wsup cache info --json`, the wsup CLI beside wsup-holder)."""
    cli = os.path.join(os.path.dirname(os.path.abspath(holder)), "wsup")
    try:
        out = subprocess.run([cli, "cache", "info", "--socket", socket, "--json"], capture_output=True, text=True,
                             timeout=30).stdout
        info = json.loads(out)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0
    return sum(int(entry.get("waiters", 0)) for entry in info.get("layouts", []))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--holder", help="path of wsup-holder")
    ap.add_argument("--lib", help="path of libwsup_client.so (default: $WSUP_CLIENT_LIB, then the usual places)")
    ap.add_argument("--testdata", required=True, help="folder of the test checkpoints")
    ap.add_argument("--device", type=int, default=0, help="cuda ordinal (default 0)")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "host"))
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--chunk-bytes", type=int, default=64 << 20,
                    help="least bytes per grant of the torch allocator (default 64 MiB: the model is tiny)")
    ap.add_argument("--role", choices=("writer", "reader"), help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--stop-before-commit", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "writer":
        return role_writer(args) or 0
    if args.role == "reader":
        return role_reader(args) or 0
    if not args.holder:
        ap.error("--holder is required")
    table = Table("step")
    try:
        import torch
        import transformers
        if args.backend == "cuda" and not torch.cuda.is_available():
            sys.exit("torch sees no CUDA device: run this on the GPU machine, or pass --backend host")
        version = "torch %s, transformers %s" % (torch.__version__, transformers.__version__)
    except ImportError as e:
        sys.exit("needs torch and transformers: %s" % e)
    print("wsup_client %s, libwsup_client %s, %s, backend %s" % (wc.__version__, wc.library_version(args.lib),
                                                                  version, args.backend))
    with tempfile.TemporaryDirectory(prefix="wsup-gpu-layout-") as tmp:
        try:
            run(table, args, tmp)
        except Exception as e:  # noqa: BLE001 - report it as a failed row, then print the table
            table.add("-", "ran to the end", False, "%s: %s" % (type(e).__name__, str(e)[:300]))
            traceback.print_exc()
    return table.finish()


if __name__ == "__main__":
    sys.exit(main())
