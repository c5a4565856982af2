#!/usr/bin/env bash
# Long streams cut by a crash: how soon the next token comes when the
# promoted engine adopts the dead engine's KV pages (docs/kv_journal.md),
# against computing the prompt and the streamed tokens again. Both in one
# run, on the same model, prompts and drills:
#   adopt:      engines as shipped (a resume waits for the pool, then adopts);
#   recompute:  engines with --kv-adopt-wait-ms 0 and --kv-adopt-keep-ms 0 (a
#               resume is computed in full as soon as the pool is there).
# For each prompt length in LENGTHS and each of its drills (DRILLS: one
# count for every length, or one per length, in LENGTHS' order): one streamed
# greedy completion of MAX_TOKENS tokens through the front; once CUT_AFTER
# tokens arrived, the active engine is SIGKILLed; the time from the kill to
# the stream's next token is measured, and the whole stream is compared
# with an uninterrupted run of the same prompt (lost: the stream did not
# end with [DONE]; different: other tokens). The node is ready again (both
# engines proven, the pool held by the active one) before the next drill.
# The model is a generated Llama (wsup-gen-llama, about 1.1B parameters,
# bf16, a context of 40960).
#
# The modes can run as separate invocations (MODES=adopt, then
# MODES=recompute, into OUTDIR/adopt and OUTDIR/recompute); SUMMARY_ONLY=1
# then only writes the table from what OUTDIR holds.
#
#   bench/kv_resume.sh OUTDIR [BIN_DIR]   # DEVICE=cuda:0 LENGTHS="8192 32768" DRILLS=5 MAX_TOKENS=16
#                                         # CUT_AFTER=4 POOL_MIB=16384 SCRATCH_MIB=64 MODES="adopt recompute"
#                                         # MODEL_DIR=/tmp/wsup-bench-llama-40k GEN_ARGS= ENGINE_ARGS=
#                                         # DOC=docs/benchmarks.md
# Prints a table and writes it to OUTDIR/kv_resume.md (and the section of DOC).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_args "usage: bench/kv_resume.sh OUTDIR [BIN_DIR]" "$@"
device=${DEVICE:-cuda:0}
lengths=${LENGTHS:-8192 32768}
drills=${DRILLS:-5}
max_tokens=${MAX_TOKENS:-16}
cut_after=${CUT_AFTER:-4}
pool_mib=${POOL_MIB:-16384}
scratch_mib=${SCRATCH_MIB:-64}
modes=${MODES:-adopt recompute}
model=${MODEL_DIR:-/tmp/wsup-bench-llama-40k}
engine_args=${ENGINE_ARGS:-}
W="$bin/wsup"
bench_device "$device"

if [ "${SUMMARY_ONLY:-0}" != 1 ]; then
bench_need wsup wsup-engine wsup-holder wsup-front wsup-gen-llama
[ -f "$model/config.json" ] || "$bin/wsup-gen-llama" --out "$model" --max-pos 40960 ${GEN_ARGS:-} | tee "$out/gen.txt"
cp "$model/config.json" "$out/model.json"

# The probe's answer: 8 greedy tokens of a plain engine on the same model.
expect=$(bench_record_expect "$model" "$device" "$out/record.log")

for mode in $modes; do
  node="$out/$mode"
  rm -rf "$node"
  extra=""
  [ "$mode" = recompute ] && extra=', "--kv-adopt-wait-ms", "0", "--kv-adopt-keep-ms", "0"'
  for a in $engine_args; do extra="$extra, \"$a\""; done
  bench_node_config "$node/node.toml" "$node" bench-kv-resume "$model" \
    "\"--kv-pool\", \"--kv-scratch-mib\", \"{kv_scratch_mib}\"$extra" 300000
  cat >> "$node/node.toml" <<EOF
[kv]
pool_mib = $pool_mib
scratch_mib = $scratch_mib

[probe]
kind = "semantic"
prompt = "Hello, world"
expect_token_ids = $expect
max_tokens = 8
# A long prefill shares every step with the probe (a 32k-token prompt
# takes about a minute on the reference engine): tolerate slow answers for
# ten minutes, but prove a restarted engine in seconds.
interval_ms = 1000
timeout_ms = 1000
failures = 600
successes = 2

[front]
listen = "127.0.0.1:0"
queue_timeout_ms = 120000
hedge_after_ms = 0

[admin]
listen = "127.0.0.1:0"

[supervisor]
max_restarts = 1000
restart_backoff_ms = 0
EOF
  "$W" check "$node/node.toml"
  setsid "$W" start "$node/node.toml" > "$node/wsup.log" 2>&1 < /dev/null &
  status=0
  sup=$!
  python3 - "$W" "$node/node.toml" "$node/drills.json" "$lengths" "$drills" "$max_tokens" "$cut_after" "$mode" <<'PY' || status=$?
import http.client, json, os, random, signal, subprocess, sys, threading, time

W, cfg, out, lengths, drills, max_tokens, cut_after, mode = sys.argv[1:9]
lengths, max_tokens, cut_after = [int(x) for x in lengths.split()], int(max_tokens), int(cut_after)
drills = [int(x) for x in drills.split()]
drills = dict(zip(lengths, drills if len(drills) == len(lengths) else drills[:1] * len(lengths)))

def status():
    r = subprocess.run([W, "status", "--config", cfg, "--json"], capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else None

def engine(st, role):
    return next((e for e in st.get("engines", []) if e.get("role") == role), None)

def settled(limit=600):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        st = status()
        if st:
            a, s = engine(st, "active"), engine(st, "standby")
            if (a and s and a.get("semantic_ready") and s.get("semantic_ready")
                    and a.get("kv", {}).get("source") == "pool"
                    and st.get("kv_pool", {}).get("owner") == a.get("slot")):
                return st
        time.sleep(0.2)
    raise SystemExit("the node did not get ready (both engines proven, the pool held) in %d s" % limit)

def engine_status(port):
    # An engine's control routes take the token the supervisor gave it,
    # which only the node's user can read (its 0600 state.json).
    with open(os.path.join(os.path.dirname(cfg), "run", "state.json")) as f:
        token = next((e.get("control_token", "") for e in json.load(f)["engines"] if e.get("port") == port), "")
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/wsup/status", headers={"Authorization": "Bearer " + token})
    return json.loads(c.getresponse().read())

def stream(port, rid, prompt, arrivals):
    """Streams a greedy completion, appending each token's arrival time to
    `arrivals`. Returns (token ids, ended with [DONE])."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True, "return_token_ids": True})
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json", "X-Request-Id": rid})
    r = c.getresponse()
    if r.status != 200:
        return [], False
    ids, done = [], False
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            done = True
            break
        ev = json.loads(data)
        for t in ev["choices"][0].get("token_ids", []):
            ids.append(t)
            arrivals.append(time.monotonic())
    return ids, done

st = settled()
front = int(st["front"]["listen"].rsplit(":", 1)[1])
rng = random.Random(7)
rows = []
for L in lengths:
    prompt = [rng.randrange(256) for _ in range(L)]
    t0 = time.monotonic()
    want, ok = stream(front, f"ref-{mode}-{L}", prompt, [])
    ref_s = time.monotonic() - t0
    if not ok or len(want) != max_tokens:
        raise SystemExit(f"the uninterrupted {L}-token run did not complete ({len(want)} tokens)")
    print(f"{mode} {L}: uninterrupted run {ref_s:.2f} s", flush=True)
    for d in range(drills[L]):
        st = settled()
        act, stby = engine(st, "active"), engine(st, "standby")
        pid, promoted_port = act["pid"], stby["port"]
        before = engine_status(promoted_port).get("resume", {})
        arrivals, result = [], {}
        reader = threading.Thread(
            target=lambda: result.update(zip(("got", "done"), stream(front, f"cut-{mode}-{L}-{d}", prompt, arrivals))))
        reader.start()
        while len(arrivals) < cut_after and reader.is_alive():
            time.sleep(0.001)
        # Stopped first, so that the tokens it had already sent arrive
        # before the kill and only the promoted engine's count as next.
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.3)
        killed_at = len(arrivals)
        t_kill = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        reader.join()
        got, done = result.get("got", []), result.get("done", False)
        nxt = next((t for t in arrivals[killed_at:] if t > t_kill), None)
        after = engine_status(promoted_port).get("resume", {})
        row = {"mode": mode, "length": L, "drill": d, "lost": not done, "different": got != want,
               "killed_after": killed_at,
               "kill_to_next_ms": (nxt - t_kill) * 1000 if nxt is not None else None,
               "adopted_tokens": after.get("adopted_tokens", 0) - before.get("adopted_tokens", 0),
               "adopted": after.get("adopted_sequences", 0) - before.get("adopted_sequences", 0),
               "recomputed": after.get("recomputed_sequences", 0) - before.get("recomputed_sequences", 0),
               "held_max_ms": after.get("held_max_ms", 0), "uninterrupted_s": ref_s}
        rows.append(row)
        print(json.dumps(row), flush=True)
json.dump(rows, open(out, "w"), indent=1)
PY
  "$W" stop --config "$node/node.toml" > /dev/null 2>&1 || kill "$sup" || true
  wait "$sup" || true
  [ "${status:-0}" = 0 ] || { echo "kv_resume: the $mode run failed; see $node/wsup.log" >&2; exit 1; }
done
fi

python3 - "$out" "$device" "$drills" "$max_tokens" "$cut_after" "$modes" "$lengths" > "$out/kv_resume.md" <<'PY'
import json, os, statistics, sys
out, device, drills, max_tokens, cut_after, modes, lengths = sys.argv[1:8]
rows = []
for m in modes.split():
    f = os.path.join(out, m, "drills.json")
    if os.path.exists(f):
        rows += json.load(open(f))
cfg = json.load(open(os.path.join(out, "model.json")))
params = (cfg["vocab_size"] * cfg["hidden_size"] * 2 + cfg["num_hidden_layers"] *
          (cfg["hidden_size"] * cfg["hidden_size"] * 2 + 2 * cfg["hidden_size"] * cfg["num_key_value_heads"] *
           (cfg["hidden_size"] // cfg["num_attention_heads"]) + 3 * cfg["hidden_size"] * cfg["intermediate_size"]))
def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]
print(f"Device {device}; a generated Llama of {params / 1e9:.2f}B parameters ({cfg['num_hidden_layers']} layers, "
      f"hidden {cfg['hidden_size']}, {cfg.get('torch_dtype', cfg.get('dtype', '?'))}); streams of {max_tokens} greedy "
      f"tokens, the active engine SIGKILLed once {cut_after} had arrived (stopped first for 300 ms, so that only the "
      f"promoted engine's tokens count as next).\n")
print("| prompt tokens | mode | drills | kill to next token p50 (ms) | max (ms) | adopted tokens per drill | recomputed | lost | different | uninterrupted run (s) |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
summary = {}
for L in [int(x) for x in lengths.split()]:
    for m in modes.split():
        r = [x for x in rows if x["mode"] == m and x["length"] == L]
        t = [x["kill_to_next_ms"] for x in r if x["kill_to_next_ms"] is not None]
        p50 = statistics.median(t) if t else float("nan")
        summary[(L, m)] = p50
        adopted = statistics.median([x["adopted_tokens"] for x in r]) if r else 0
        if not r:
            continue
        print(f"| {L} | {m} | {len(r)} | {p50:.0f} | {max(t) if t else float('nan'):.0f} | {adopted:.0f} | "
              f"{sum(x['recomputed'] for x in r)} | {sum(x['lost'] for x in r)} | {sum(x['different'] for x in r)} | "
              f"{r[0]['uninterrupted_s'] if r else 0:.2f} |")
print()
for L in [int(x) for x in lengths.split()]:
    if (L, "adopt") in summary and (L, "recompute") in summary and summary[(L, "adopt")] > 0:
        print(f"- {L} tokens: recompute / adopt (kill to next token, p50) = "
              f"{summary[(L, 'recompute')] / summary[(L, 'adopt')]:.1f}x")
PY
cat "$out/kv_resume.md"
if [ -n "${DOC:-}" ]; then
  {
    echo "\`DEVICE=$device LENGTHS=\"$lengths\" DRILLS=$drills bench/kv_resume.sh OUTDIR\`, $(date -u +%Y-%m-%d), $(nproc) CPUs$( [ "$device" != cpu ] && echo ", $(nvidia-smi --query-gpu=name --format=csv,noheader -i "${device#cuda:}" | head -1)")."
    echo
    cat "$out/kv_resume.md"
  } > "$out/section.md"
  python3 "$here/doc_section.py" "$DOC" "## KV adoption: a long stream cut by a crash" "$out/section.md"
fi
