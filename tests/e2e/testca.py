"""A throwaway test CA and one server certificate signed by it (openssl), for the
tests' and benchmarks' own TLS servers. Standalone: the unit tests and bench/ load it
by path too."""

from __future__ import annotations

import subprocess
from pathlib import Path


def make_ca(d: Path, names: list[str], ips: tuple[str, ...] = (), cn: str = "kooi test CA",
            days: int = 2) -> tuple[Path, Path, Path]:
    """In D: a CA and a certificate for NAMES (DNS) and IPS; returns (ca.pem,
    server.pem, server.key)."""

    def ossl(*a: str) -> None:
        subprocess.run(["openssl", *a], check=True, capture_output=True)

    ca, cert, key = d / "ca.pem", d / "server.pem", d / "server.key"
    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", str(days), "-subj", f"/CN={cn}",
         "-keyout", str(d / "ca.key"), "-out", str(ca))
    ossl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={names[0]}", "-keyout", str(key),
         "-out", str(d / "server.csr"))
    san = ",".join([f"DNS:{n}" for n in names] + [f"IP:{i}" for i in ips])
    (d / "san.ext").write_text(f"subjectAltName={san}\n")
    ossl("x509", "-req", "-in", str(d / "server.csr"), "-CA", str(ca), "-CAkey", str(d / "ca.key"),
         "-CAcreateserial", "-days", str(days), "-extfile", str(d / "san.ext"), "-out", str(cert))
    return ca, cert, key
