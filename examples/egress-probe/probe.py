"""What a workload can reach (kooi's egress tests run it with network: proxy; an
operator can run it to see a host's egress policy from inside). Prints one line
"KOOI-PROBE <json>": for each check, what happened.

Targets come from the environment: KOOI_PROBE_ALLOWED, _BLOCKED, _PRIVATE (names),
KOOI_PROBE_ADDR and KOOI_PROBE_ADDR6 (an upstream's addresses), KOOI_PROBE_CA (a CA
file for the HTTPS checks)."""

import json
import os
import socket
import subprocess

E = os.environ
CA = E.get("KOOI_PROBE_CA", "/etc/ssl/certs/ca-certificates.crt")
PROXY = E.get("https_proxy", "")


def curl(url, *extra, proxy_always=False):
    cmd = ["curl", "-sS", "--max-time", "20", "--cacert", CA, "-o", "-",
           "-w", "\nKOOI-HTTP %{http_code} %{http_connect}", *extra, url]
    if proxy_always and PROXY:
        cmd[1:1] = ["--proxy", PROXY, "--noproxy", ""]
    p = subprocess.run(cmd, capture_output=True, text=True)
    body, _, codes = p.stdout.rpartition("\nKOOI-HTTP ")
    code, connect = (codes.split() + ["000", "000"])[:2]
    return {"rc": p.returncode, "code": int(code), "connect": int(connect), "body": body.strip()[:200],
            "err": p.stderr.strip()[:200]}


def tcp(addr, port, family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(8)
    try:
        s.connect((addr, port))
        return {"connected": True}
    except OSError as exc:
        return {"connected": False, "err": f"{exc.__class__.__name__}: {exc}"}
    finally:
        s.close()


def udp(addr, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(4)
    # A DNS query for example.org (A), the shape an exfiltration channel would take.
    q = bytes.fromhex("abcd01000001000000000000076578616d706c65036f72670000010001")
    try:
        s.sendto(q, (addr, port))
        data, _ = s.recvfrom(4096)
        return {"answered": True, "bytes": len(data)}
    except OSError as exc:
        return {"answered": False, "err": f"{exc.__class__.__name__}: {exc}"}
    finally:
        s.close()


allowed, blocked, private = E["KOOI_PROBE_ALLOWED"], E["KOOI_PROBE_BLOCKED"], E["KOOI_PROBE_PRIVATE"]
addr, addr6 = E["KOOI_PROBE_ADDR"], E["KOOI_PROBE_ADDR6"]
out = {
    "proxy": PROXY,
    "http_allowed": curl(f"http://{allowed}/probe"),
    "https_allowed": curl(f"https://{allowed}/probe"),
    "http_blocked": curl(f"http://{blocked}/probe"),
    "https_blocked": curl(f"https://{blocked}/probe"),
    "private_guard": curl(f"http://{private}/probe"),
    "connect_ip_literal": curl(f"https://{addr}/probe", proxy_always=True),
    "connect_8443": curl(f"https://{allowed}:8443/probe"),
    "direct_tcp": tcp(addr, 80),
    "direct_tls_port": tcp(addr, 443),
    "direct_udp_dns": udp(addr, 53),
    "direct_ipv6": tcp(addr6, 80, socket.AF_INET6),
}
print("KOOI-PROBE " + json.dumps(out), flush=True)
