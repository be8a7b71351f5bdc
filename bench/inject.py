"""Benchmark: what the secrets injector adds to a Messages API request. Not a test: it
asserts nothing.

The scripted Messages API (tests/e2e/messages_api.py, HTTPS with a CA made here) on
loopback, and kooi's injector (kooi.injectproxy.ProxyServer, the code `kooi secrets serve`
runs, in this process) in front of it with a placeholder registered. Side by side,
alternating, N requests each:

- direct: the client speaks TLS to the API itself, a fresh connection per request
  (the scripted API ends each streamed answer by closing the connection, as the
  baseline for both: the injector, too, opens one TLS connection per request);
- injected: the client speaks plain HTTP to the injector, which replaces the
  credential and opens a verified TLS connection to the API per request.

Each request is a streamed Messages call (a text turn: message_start ... message_stop),
read to its end. Medians, the added milliseconds and the ratios.

Usage: python bench/inject.py [--calls 200]
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "shim"))
sys.path.insert(0, str(REPO / "tests/e2e"))

from testca import make_ca  # noqa: E402

from kooi import injectcontrol, injectproxy  # noqa: E402
from kooi.hoststate import secrets as secrets_state  # noqa: E402

BODY = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 16, "stream": True,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def once(conn: http.client.HTTPConnection, key: str) -> float:
    t0 = time.perf_counter()
    conn.request("POST", "/v1/messages?beta=true", body=BODY,
                 headers={"x-api-key": key, "anthropic-version": "2023-06-01", "content-type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    assert r.status == 200 and b"message_stop" in data, (r.status, data[:200])
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="kooi-bench-inject-"))

    make_ca(d, ["localhost"], cn="bench CA", days=1)
    (d / "script.json").write_text(json.dumps({"model_turns": [{"text": "ok"}]}))
    api_port = free_port()
    api = subprocess.Popen([sys.executable, str(REPO / "tests/e2e/messages_api.py"), "--bind", "127.0.0.1",
                            "--port", str(api_port), "--cert", str(d / "server.pem"), "--key", str(d / "server.key"),
                            "--script", str(d / "script.json"), "--log", str(d / "log.jsonl")],
                           stdout=subprocess.PIPE, text=True)
    assert api.stdout is not None and api.stdout.readline().strip() == "ready"
    cfg = secrets_state.parse(json.dumps({"injector": {"port": 0}, "secrets": {"api": {
        "mode": "inject", "env": "ANTHROPIC_API_KEY", "upstream": f"https://localhost:{api_port}",
        "ca_file": str(d / "ca.pem"), "paths": ["/v1/messages"], "query": ["beta=true"]}}}))
    reg = injectcontrol.Registry()
    srv = injectproxy.ProxyServer(("127.0.0.1", 0), cfg, {"api": b"sk-ant-bench"}, reg)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    token = reg.add("bench", "bench", ["api"], ttl=3600)["api"]
    tls = ssl.create_default_context(cafile=str(d / "ca.pem"))
    runs: dict[str, list[float]] = {"direct (TLS to the API)": [], "through the injector": []}
    try:
        for _ in range(5):  # warm-up
            once(http.client.HTTPSConnection("localhost", api_port, context=tls, timeout=30), "sk-ant-bench")
        for _ in range(args.calls):
            c = http.client.HTTPSConnection("localhost", api_port, context=tls, timeout=30)
            runs["direct (TLS to the API)"].append(once(c, "sk-ant-bench"))
            c.close()
            c2 = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=30)
            runs["through the injector"].append(once(c2, token))
            c2.close()
    finally:
        srv.shutdown()
        api.kill()
        api.wait()
    base = statistics.median(runs["direct (TLS to the API)"])
    print(f"{args.calls} streamed Messages requests each, alternating (medians, ms):")
    for name, xs in runs.items():
        med = statistics.median(xs)
        print(f"  {name:<26} {med:7.2f}  (p90 {sorted(xs)[int(len(xs) * 0.9)]:.2f})  x{med / base:.2f}")
    inj = statistics.median(runs["through the injector"])
    print(f"added by the injector: {inj - base:+.2f} ms per request")


if __name__ == "__main__":
    main()
