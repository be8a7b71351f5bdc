"""Benchmark: what the egress proxy costs. Not a test: it asserts nothing.

An upstream in a network namespace of its own (tests/e2e/upstream_server.py: HTTP and
HTTPS, never an outside address) and a second Squid instance rendered from the
host's kooi configuration (/etc/kooi/egress/squid.conf: the same ACLs, logging and
settings; only its port, allowlist, pid and log paths differ, so the live proxy and
its allowlist stay untouched). As root, side by side, alternating:

1. bulk download: GET of N MiB, direct vs through the proxy (HTTP), and over TLS
   direct vs CONNECT through the proxy; median throughput of R runs and the ratio;
   unpaced (a loopback copy, CPU-bound) and with the upstream paced at a network-like
   rate (--pace MiB/s, what a registry download looks like);
2. latency per request: a fresh connection + a small GET, direct vs through the
   proxy; medians of C requests and the added milliseconds.

Usage (as root on a host provisioned with egress control):
    python bench/egress.py [--mib 256] [--runs 5] [--calls 300]
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import ssl
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NS, ADDR, NAME, PORT = "kooi-bench-up", "10.214.0.2", "bench.kooi.test", 3199


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def setup(work: Path) -> tuple[subprocess.Popen, subprocess.Popen, Path]:
    for args in (["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=kooi bench CA",
                  "-keyout", "ca.key", "-out", "ca.pem"],
                 ["req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={NAME}", "-keyout", "srv.key",
                  "-out", "srv.csr"]):
        subprocess.run(["openssl", *args], cwd=work, check=True, capture_output=True)
    (work / "san").write_text(f"subjectAltName=DNS:{NAME}\n")
    subprocess.run(["openssl", "x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                    "-CAcreateserial", "-days", "1", "-extfile", "san", "-out", "srv.pem"],
                   cwd=work, check=True, capture_output=True)
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    sh("ip", "netns", "add", NS)
    sh("ip", "link", "add", "kooi-bench0", "type", "veth", "peer", "name", "b1", "netns", NS)
    sh("ip", "addr", "add", "10.214.0.1/24", "dev", "kooi-bench0")
    sh("ip", "link", "set", "kooi-bench0", "up")
    sh("ip", "-n", NS, "addr", "add", f"{ADDR}/24", "dev", "b1")
    sh("ip", "-n", NS, "link", "set", "b1", "up")
    sh("ip", "-n", NS, "link", "set", "lo", "up")
    upstream = subprocess.Popen(["ip", "netns", "exec", NS, "python3", str(REPO / "tests/e2e/upstream_server.py"),
                                 str(work / "srv.pem"), str(work / "srv.key")], stdout=subprocess.PIPE, text=True)
    assert upstream.stdout.readline().strip() == "ready"
    # A second Squid from kooi's own configuration: its port, lists, pid and logs.
    conf = Path("/etc/kooi/egress/squid.conf").read_text()
    (work / "allow.txt").write_text(f"{NAME}\n")
    (work / "private.txt").write_text(f"{NAME}\n")
    (work / "hosts").write_text(f"{ADDR} {NAME}\n")
    conf = re.sub(r"^http_port .*$", f"http_port 127.0.0.1:{PORT}", conf, flags=re.M)
    conf = conf.replace('"/etc/kooi/egress/allow.txt"', f'"{work}/allow.txt"')
    conf = conf.replace('"/etc/kooi/egress/private-hosts.txt"', f'"{work}/private.txt"')
    conf = re.sub(r"^pid_filename .*$", f"pid_filename {work}/squid.pid", conf, flags=re.M)
    conf = re.sub(r"^hosts_file .*$", f"hosts_file {work}/hosts", conf, flags=re.M)
    conf = re.sub(r"stdio:\S+", f"stdio:{work}/access.log", conf)
    conf = re.sub(r"^cache_log .*$", f"cache_log {work}/cache.log", conf, flags=re.M)
    (work / "squid.conf").write_text(conf)
    shutil.chown(work, "proxy")
    for f in work.iterdir():
        f.chmod(0o644)
    work.chmod(0o755)
    squid = subprocess.Popen(["squid", "-N", "-f", str(work / "squid.conf")], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", PORT), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    return upstream, squid, work / "ca.pem"


def teardown(upstream, squid) -> None:
    for p in (squid, upstream):
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    subprocess.run(["ip", "link", "del", "kooi-bench0"], capture_output=True)


def fetch(path: str, proxy: bool, tls: bool, ca: Path) -> int:
    """One request on a fresh connection; returns the body size."""
    port = 443 if tls else 80
    if proxy:
        s = socket.create_connection(("127.0.0.1", PORT), timeout=60)
        if tls:
            s.sendall(f"CONNECT {NAME}:443 HTTP/1.1\r\nHost: {NAME}:443\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += s.recv(4096)
            assert b" 200 " in head.split(b"\r\n")[0], head
    else:
        s = socket.create_connection((ADDR, port), timeout=60)
    if tls:
        ctx = ssl.create_default_context(cafile=str(ca))
        s = ctx.wrap_socket(s, server_hostname=NAME)
    target = f"http://{NAME}{path}" if proxy and not tls else path
    s.sendall(f"GET {target} HTTP/1.1\r\nHost: {NAME}\r\nConnection: close\r\n\r\n".encode())
    n = 0
    while True:
        data = s.recv(1 << 20)
        if not data:
            break
        n += len(data)
    s.close()
    return n


def bulk(mib: int, runs: int, ca: Path, pace: float = 0) -> None:
    how = f"upstream paced at {pace:g} MiB/s" if pace else "unpaced (a loopback copy: CPU-bound)"
    print(f"\n## bulk download, {mib} MiB, {how}, median of {runs} (MiB/s)")
    print("| path | direct | through the proxy | ratio proxy / direct |\n|---|---|---|---|")
    suffix = f"/{pace:g}" if pace else ""
    for tls in (False, True):
        rates: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(runs):
            for proxy in (False, True):
                t0 = time.perf_counter()
                n = fetch(f"/bytes/{mib << 20}{suffix}", proxy, tls, ca)
                rates[proxy].append(n / (1 << 20) / (time.perf_counter() - t0))
        d, p = statistics.median(rates[False]), statistics.median(rates[True])
        print(f"| {'HTTPS (CONNECT)' if tls else 'HTTP'} | {d:.0f} | {p:.0f} | {p / d:.2f}x |")


def latency(calls: int, ca: Path) -> None:
    print(f"\n## latency per request (fresh connection + GET), median of {calls} (ms)")
    print("| path | direct | through the proxy | added | ratio |\n|---|---|---|---|---|")
    for tls in (False, True):
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(10):
            fetch("/small", True, tls, ca)
        for _ in range(calls):
            for proxy in (False, True):
                t0 = time.perf_counter()
                fetch("/small", proxy, tls, ca)
                times[proxy].append((time.perf_counter() - t0) * 1000)
        d, p = statistics.median(times[False]), statistics.median(times[True])
        print(f"| {'HTTPS (CONNECT)' if tls else 'HTTP'} | {d:.2f} | {p:.2f} | +{p - d:.2f} | {p / d:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--pace", type=float, default=50, help="MiB/s of the paced download (0: skip it)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kooi-bench-egress-", dir="/var/tmp"))
    upstream, squid, ca = setup(work)
    try:
        latency(args.calls, ca)
        bulk(args.mib, args.runs, ca)
        if args.pace:
            bulk(min(args.mib, int(args.pace * 4)), args.runs, ca, args.pace)
    finally:
        teardown(upstream, squid)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
