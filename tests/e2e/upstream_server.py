"""Test upstreams for the egress tests, run inside a network namespace the tests
create (never a real outside address): HTTP on :80, HTTPS on :443 and :8443 (a
certificate from the tests' own CA), a UDP echo on :53 (an "outside resolver"), on
IPv4 and IPv6. GET /bytes/N[/RATE] answers N bytes, paced at RATE MiB/s if given
(benchmarks); other paths answer
"kooi-upstream <host> <path>".

Usage: python3 upstream_server.py CERT KEY
"""

from __future__ import annotations

import http.server
import socket
import socketserver
import ssl
import sys
import threading
import time


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out as separate writes: without TCP_NODELAY a reused
    # connection (the proxy keeps them) waits for a delayed ACK (~40 ms) in between.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        if self.path.startswith("/bytes/"):
            # /bytes/N or /bytes/N/RATE: N bytes, optionally paced at RATE MiB/s (a
            # network-speed download rather than a loopback copy).
            parts = self.path.split("/")
            n = int(parts[2])
            rate = float(parts[3]) * (1 << 20) if len(parts) > 3 else 0.0
            t0 = time.monotonic()
            sent = 0
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(n))
            self.end_headers()
            chunk = b"k" * 65536
            while n > 0:
                self.wfile.write(chunk[:min(n, len(chunk))])
                n -= len(chunk)
                sent += len(chunk)
                if rate:
                    ahead = sent / rate - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
            return
        body = f"kooi-upstream {self.headers.get('Host', '-')} {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class Server6(Server):
    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        super().server_bind()


def serve(server) -> None:
    threading.Thread(target=server.serve_forever, daemon=True).start()


def udp_echo(family: int, addr: str) -> None:
    s = socket.socket(family, socket.SOCK_DGRAM)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((addr, 53))

    def loop() -> None:
        while True:
            data, peer = s.recvfrom(4096)
            s.sendto(data, peer)

    threading.Thread(target=loop, daemon=True).start()


def main() -> None:
    cert, key = sys.argv[1], sys.argv[2]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    for cls, addr in ((Server, "0.0.0.0"), (Server6, "::")):
        serve(cls((addr, 80), Handler))
        for port in (443, 8443):
            srv = cls((addr, port), Handler)
            srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
            serve(srv)
    udp_echo(socket.AF_INET, "0.0.0.0")
    udp_echo(socket.AF_INET6, "::")
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
