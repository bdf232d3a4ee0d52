"""The server's resilience soak, end to end (`make soak`): start `specwise serve`, keep it busy
with `specwise bench load --soak` (faults injected beside the load, greedy answers checked
against the same requests alone), then SIGTERM it and check that it drained and exited cleanly.
Exits 0 only when every check of the soak passed, the server was still up at the end and it
exited with 0.

Usage: python scripts/soak.py [--seconds 3600] [--clients 8] [--faults 5] [--max-tokens 64]
           [--port 8799] [--out DIR] [-- SERVE ARGS...]   (serve's default: --pair qwen-coder)
"""

import argparse
import signal
import subprocess
import sys
import time

import httpx

from specwise.cli import main

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--seconds", type=float, default=3600.0, help="how long the soak runs (3600)")
p.add_argument("--clients", type=int, default=8, help="requests in flight (8)")
p.add_argument("--faults", type=float, default=5.0, help="seconds between faults (5)")
p.add_argument("--max-tokens", type=int, default=64)
p.add_argument("--sample-every", type=float, default=60.0, help="seconds between samples (60)")
p.add_argument("--port", type=int, default=8799)
p.add_argument("--out", help="the soak's folder (default bench-results/<timestamp>-load)")
p.add_argument("serve", nargs="*", help="after --: arguments of specwise serve")
a = p.parse_args()
serve = a.serve or ["--pair", "qwen-coder", "--max-batch", "4"]
url = f"http://127.0.0.1:{a.port}"
cmd = [sys.executable, "-c", "import sys; from specwise.cli import main; sys.exit(main())"]
server = subprocess.Popen([*cmd, "serve", *serve, "--port", str(a.port)])


def up() -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


deadline = time.time() + 1800  # a first start may pull and calibrate
while not up():
    if server.poll() is not None or time.time() > deadline:
        server.kill()
        raise SystemExit(f"the server did not start (exit code {server.poll()})")
    time.sleep(2)
args = ["bench", "load", "--url", url, "--soak", str(a.seconds), "--concurrency"]
args += [str(a.clients), "--stream", "--faults", str(a.faults), "--alone"]
args += ["--max-tokens", str(a.max_tokens), "--sample-every", str(a.sample_every)]
soak = main([*args, *(["--out", a.out] if a.out else [])])
alive = server.poll() is None and up()
server.send_signal(signal.SIGTERM)
try:
    code = server.wait(timeout=120)
except subprocess.TimeoutExpired:
    server.kill()
    code = None
print(f"{'PASS' if alive else 'FAIL'}  the server was up at the end of the soak")
print(f"{'PASS' if code == 0 else 'FAIL'}  it drained and exited with 0 on SIGTERM ({code})")
ok = soak == 0 and alive and code == 0
print(f"make soak: {'passed' if ok else 'FAILED'}")
raise SystemExit(0 if ok else 1)
