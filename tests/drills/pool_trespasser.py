#!/usr/bin/env python3
"""An engine command for the fence test: wsup-engine, with one misbehaviour.

    pool_trespasser.py GO_FILE ONCE_FILE ENGINE_PROGRAM ARGS...

Runs the engine as its child (with every inherited fd: the lifeline, the
death word). Once GO_FILE exists (the test makes it when the node serves)
and its engine is the node's standby, it asks that engine to map the
node's KV pool, with the control token the supervisor gave it: an engine
that maps the pool although the supervisor did not make it the owner, as a
buggy or hostile engine command could. Only the wrapper that creates
ONCE_FILE does it; every other start behaves. Exits as the engine does;
the supervisor kills the whole process group.
"""
import http.client
import json
import os
import subprocess
import sys
import time


def control(port, method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    headers = {"Authorization": "Bearer " + os.environ.get("WSUP_CONTROL_TOKEN", "")}
    if body is not None:
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def main():
    go_file, once_file, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    port = int(argv[argv.index("--port") + 1])
    engine = subprocess.Popen(argv, close_fds=False)
    # Until the engine exits, or this wrapper has done (or lost) its one turn.
    while engine.poll() is None and not os.path.exists(once_file):
        if os.path.exists(go_file):
            try:
                status, body = control(port, "GET", "/wsup/status")
                st = json.loads(body) if status == 200 else {}
            except (OSError, ValueError):
                st = {}
            if st.get("state") == "ready" and st.get("role") == "standby":
                try:
                    os.close(os.open(once_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
                except FileExistsError:
                    break
                status, body = control(port, "POST", "/wsup/role", {"role": "active", "kv": "pool"})
                sys.stderr.write("pool_trespasser: mapped the pool unasked: %d %s\n" % (status, body[:300]))
                sys.stderr.flush()
                break
        time.sleep(0.05)
    sys.exit(engine.wait())


if __name__ == "__main__":
    main()
