"""Benchmark: the secrets injector's memory over repeated full load cycles. Not a test:
it asserts nothing.

Review 30 found the injector's resident memory growing from one full load cycle to the
next (4.08 GiB on the second, past the unit's MemoryMax=4G): glibc's allocator kept
what the injector had freed. This runs the injector (kooi.injectproxy.ProxyServer, in a
child process set up as `kooi secrets serve` sets itself up, or without kooi's allocator
settings: --baseline) with MAX_RUNS runs registered, and per cycle sends each run
PER_RUN bodies at once of about SIZE MiB that parse into many small objects (a long
`messages` list) and are then refused by the body check (an MCP connector): every
byte is read, charged, parsed and freed. After each cycle (and a second's rest) it
reads the child's resident memory (VmRSS) and its peak so far (VmHWM).

Usage: python bench/inject_memory.py [--cycles 4] [--size 8] [--per-run 2] [--baseline]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, threading
sys.path.insert(0, sys.argv[1])
from kooi import inject, injectcontrol, injectproxy
from kooi.hoststate import secrets as secrets_state
if sys.argv[2] == "tuned":
    inject.tune_memory()
cfg = secrets_state.parse(json.dumps({"injector": {"port": 3129}, "secrets": {"api": {
    "mode": "inject", "env": "ANTHROPIC_API_KEY", "upstream": "https://127.0.0.1:9",
    "header": "x-api-key", "paths": ["/v1/messages"], "methods": ["POST"], "body": "anthropic-messages"}}}))
reg = injectcontrol.Registry()
tokens = [reg.add(f"run-{i}", "wf", ["api"], ttl=3600)["api"] for i in range(injectcontrol.MAX_RUNS)]
threading.stack_size(injectproxy.THREAD_STACK)
srv = injectproxy.ProxyServer(("127.0.0.1", 0), cfg, {"api": b"REAL"}, reg)
print(json.dumps({"port": srv.server_address[1], "tokens": tokens}), flush=True)
srv.serve_forever()
"""


def body(mib: int, seed: int) -> bytes:
    text = "x" * (40 + seed % 50)
    n = (mib << 20) // (len(text) + 40)
    return json.dumps({"model": "m", "mcp_servers": [{"type": "url", "url": "http://127.0.0.1:1"}],
                       "messages": [{"role": "user", "content": text}] * n}).encode()


def send(port: int, tok: str, data: bytes, out: list[int]) -> None:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=120)
        s.sendall(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {tok}\r\nContent-Type: application/json"
                  f"\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        answer = s.recv(64)
        out.append(int(answer.split()[1]) if answer.startswith(b"HTTP/1.1 ") else 0)
        s.close()
    except OSError:
        out.append(0)


def memory(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=4)
    ap.add_argument("--size", type=int, default=8, help="MiB per body")
    ap.add_argument("--per-run", type=int, default=2)
    ap.add_argument("--baseline", action="store_true", help="without kooi's allocator settings")
    a = ap.parse_args()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(REPO / "shim"), "plain" if a.baseline else "tuned"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        info = json.loads(child.stdout.readline())
        bodies = [body(a.size, i) for i in range(8)]
        print(f"{'baseline' if a.baseline else 'kooi'}: {len(info['tokens'])} runs x {a.per_run} bodies of "
              f"{len(bodies[0]) >> 20} MiB per cycle; start RSS {memory(child.pid)[0]:.0f} MiB")
        for c in range(a.cycles):
            out: list[int] = []
            threads = [threading.Thread(target=send, args=(info["port"], tok, bodies[(i + j) % 8], out))
                       for i, tok in enumerate(info["tokens"]) for j in range(a.per_run)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            time.sleep(1)
            rss, hwm = memory(child.pid)
            counts = {s: out.count(s) for s in sorted(set(out))}
            print(f"cycle {c + 1}: {time.monotonic() - t0:.1f} s, answers {counts}, RSS after {rss:.0f} MiB, "
                  f"peak so far {hwm:.0f} MiB", flush=True)
    finally:
        child.kill()
        child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
