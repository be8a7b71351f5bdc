"""kooi's credential injector: the host adds a secret to a workload's API requests, so
the secret never enters the sandbox.

One daemon per host (`kooi secrets serve`; kooi-inject.service, or `kooi secrets
start` on hosts without systemd). It starts as root, reads the secrets description
(/etc/kooi/secrets.json) and the values from the root-only store, opens its two
sockets, and drops to its own user (no groups, no_new_privs) before it serves:

- a control socket (unix, root and the runner's group) where `kooi run` registers a
  run: the injector reads the workflow itself from the root-owned workflow directory,
  and answers with a fresh placeholder per inject secret the workflow names (and the
  values of its environment secrets), valid until the run releases it or its timeout
  has passed; the release answers with the run's record (requests forwarded, requests
  refused). A placeholder identifies its run: concurrent runs never mix.
- a plain-HTTP reverse proxy on the run's proxy path (host loopback, reached as
  10.0.2.2 from the rootless engine; every address on userns_remap hosts, where the
  nftables input chain admits only Docker bridges). A request must carry a live
  placeholder (x-api-key or Authorization: Bearer), a method and path the secret
  allows; then the injector removes every credential header the request carried,
  adds the real one, and forwards it over TLS (verified) to the secret's upstream,
  streaming the answer back unbuffered. Anything else is refused (401/403) and
  recorded for the run. The workload can therefore use the API host neither with a
  key of its own (the header is always replaced) nor for other paths.

The access log (JSON lines) records run, secret, method, path, status and bytes; never
a header value.

The control socket and its registry of runs are kooi.injectcontrol, the reverse proxy
kooi.injectproxy; this module starts the daemon (`serve`) and holds the clients of its
control socket (`call`, `status`, `start`, `stop`).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .hoststate.secrets import SecretsConfig, value_keys, value_path


class InjectError(Exception):
    """The injector is missing, down or refused; the message says what to do."""


def read_values(cfg: SecretsConfig) -> dict[str, bytes]:
    """Root: every secret's value from the store, which must be root's alone, by store
    key (NAME, or NAME@PERSON for a secret held per person)."""
    store = Path(cfg.store)
    st = store.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077:
        raise InjectError(f"{store}: the secrets store must be a directory owned by root, mode 0700; re-run site.yml")
    out = {}
    for key in [k for s in cfg.secrets.values() for k in value_keys(s)]:
        p, name = value_path(cfg, key), key
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise InjectError(f"{p}: cannot read secret {name!r} ({exc.strerror}); re-run site.yml") from None
        with os.fdopen(fd, "rb") as f:
            fst = os.fstat(f.fileno())
            if fst.st_uid != 0 or stat.S_IMODE(fst.st_mode) & 0o077 or not stat.S_ISREG(fst.st_mode):
                raise InjectError(f"{p}: a secret must be a regular file owned by root, mode 0600; re-run site.yml")
            value = f.read().rstrip(b"\r\n")
        if not value or b"\n" in value or b"\r" in value:
            raise InjectError(f"{p}: secret {name!r} is empty or spans lines; re-run site.yml")
        out[key] = value
    return out


# --- serve (root, then its own user) --------------------------------------------------


def _drop_to(user: str) -> None:
    import pwd

    pw = pwd.getpwnam(user)
    if pw.pw_uid == 0:
        raise InjectError(f"the injector's user {user} is root; it must be an unprivileged account")
    os.setgroups([])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise InjectError("prctl(PR_SET_NO_NEW_PRIVS) failed")
    if os.getuid() == 0 or os.geteuid() == 0:
        raise InjectError("could not drop root")


def _raise_limits() -> None:
    """Descriptors for the proxy's bound (injectproxy.MAX_CONNECTIONS, each forwarded
    request one more upstream) and small thread stacks: a connection is a thread."""
    import resource

    from .injectproxy import MAX_CONNECTIONS, THREAD_STACK

    want = 2 * MAX_CONNECTIONS + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        top = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, top), hard))
    threading.stack_size(THREAD_STACK)


def tune_memory() -> None:
    """glibc's allocator as the injector needs it (review 30: resident memory grew from
    one full load cycle to the next, 4.08 GiB on the second, past the unit's MemoryMax):
    blocks from 128 KiB up (the growing request bodies) mapped on their own and given
    back when freed (a fixed threshold: glibc's moving one kept them in the heap after
    the first large free), freed heap tops trimmed past 1 MiB, and two arenas instead of
    eight per core for hundreds of threads. bench/inject_memory.py measures it."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return  # not glibc
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
    mallopt(m_mmap_threshold, 128 << 10)
    mallopt(m_trim_threshold, 1 << 20)
    mallopt(m_arena_max, 2)


def registry_dir(run_dir: Path, user: str) -> Path:
    """RUN_DIR/registry, the injector's USER's (0700), made or kept as it is: root
    here holds CAP_CHOWN but not CAP_FOWNER (the unit's bound), so it never changes
    the mode of a directory it no longer owns (the first start with that bound died
    there, and systemd started it again and again)."""
    import pwd

    state = run_dir / "registry"
    if state.is_symlink() or (state.exists() and not state.is_dir()):
        state.unlink()
    pw = pwd.getpwnam(user)
    if not state.exists():
        state.mkdir(mode=0o700)
        os.chmod(state, 0o700)
    if state.stat().st_uid != pw.pw_uid:
        os.chown(state, pw.pw_uid, pw.pw_gid, follow_symlinks=False)
    return state


def serve(cfg: SecretsConfig, workflow_dir: Path | None = None) -> int:
    """Root: read the values, open the sockets, drop to the injector's user, serve until
    SIGTERM/SIGINT."""
    from .injectcontrol import ControlServer, Registry  # (they import InjectError from here)
    from .injectproxy import ProxyServer

    if os.geteuid() != 0:
        raise InjectError("kooi secrets serve must start as root (it reads the root-only store, then drops)")
    tune_memory()
    os.umask(0o077)
    inj = cfg.injector
    values = read_values(cfg)
    run_dir = Path(inj.control).parent
    run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(run_dir, 0o755)
    # The live runs, kept across a restart (injectcontrol.Registry), in a directory of
    # the injector's user that nobody else reads (the placeholders).
    registry = Registry(registry_dir(run_dir, inj.user) / "runs.json")
    Path(inj.control).unlink(missing_ok=True)
    control = ControlServer(inj.control, inj.control_group, cfg, values, registry, workflow_dir)
    os.chown(inj.control, 0, inj.control_group)
    os.chmod(inj.control, 0o660)
    _raise_limits()
    proxy = ProxyServer((inj.listen, inj.port), cfg, values, registry)
    Path(inj.pid_file).write_text(f"{os.getpid()}\n")
    os.chmod(inj.pid_file, 0o644)
    _drop_to(inj.user)
    kept = registry.load()
    try:
        proxy.log_file = open(inj.access_log, "a", buffering=1)
        proxy.log_path = inj.access_log
    except OSError as exc:
        raise InjectError(f"cannot open the access log {inj.access_log} as {inj.user} ({exc.strerror}): its "
                          f"directory must belong to {inj.user} and every parent be open to it (re-run "
                          "site.yml, role secrets)") from None
    threading.Thread(target=control.serve_forever, daemon=True).start()

    def stop(_signum: int, _frame: Any) -> None:
        threading.Thread(target=proxy.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"kooi injector: serving {', '.join(sorted(cfg.injected)) or 'no inject secrets'} on "
          f"{inj.listen}:{inj.port} as {inj.user}" + (f"; {kept} live runs kept from before" if kept else ""),
          flush=True)
    proxy.serve_forever(poll_interval=0.5)
    control.server_close()
    return 0


# --- clients (kooi run, kooi secrets, the checks) ----------------------------------------


def _connect(path: str, timeout: float) -> socket.socket:
    """A connection to the control socket at PATH, waiting up to TIMEOUT for room in its
    listen queue (a full queue answers a connect with a timeout EAGAIN at once; review
    31: runs ending together failed their releases)."""
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(path)
            return s
        except BlockingIOError:
            s.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)
        except OSError:
            s.close()
            raise


def call(cfg: SecretsConfig, req: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    try:
        s = _connect(cfg.injector.control, timeout)
    except OSError as exc:
        raise InjectError(f"the injector does not answer on {cfg.injector.control} ({exc.strerror or exc}); "
                          "start it: kooi secrets start (root), or re-run site.yml") from None
    try:
        s.sendall(json.dumps(req).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            piece = s.recv(65536)
            if not piece:
                break
            buf += piece
    except OSError as exc:
        raise InjectError(f"the injector does not answer on {cfg.injector.control} ({exc.strerror or exc}); "
                          "start it: kooi secrets start (root), or re-run site.yml") from None
    finally:
        s.close()
    try:
        doc: dict[str, Any] = json.loads(buf)
    except ValueError:
        raise InjectError(f"the injector answered {buf[:200]!r}") from None
    if not doc.get("ok"):
        raise InjectError(f"the injector refused: {doc.get('error')}")
    return doc


def status(cfg: SecretsConfig) -> dict[str, Any]:
    try:
        st = call(cfg, {"op": "status"}, timeout=3)
        return {"up": True, "pid": st["pid"], "uid": st["uid"], "runs": st["runs"], "secrets": st["secrets"],
                "listen": f"{cfg.injector.listen}:{cfg.injector.port}", "systemd_unit": cfg.injector.systemd_unit}
    except InjectError as exc:
        return {"up": False, "detail": str(exc), "listen": f"{cfg.injector.listen}:{cfg.injector.port}",
                "systemd_unit": cfg.injector.systemd_unit}


def start(cfg: SecretsConfig, timeout: float = 20.0) -> bool:
    """Root: start the injector where it is down (hosts without systemd; on systemd
    hosts the unit). True when it was started."""
    if os.geteuid() != 0:
        raise InjectError("kooi secrets start needs root")
    if status(cfg)["up"]:
        return False
    unit = cfg.injector.systemd_unit
    if unit and Path("/run/systemd/system").is_dir():
        res = subprocess.run(["systemctl", "start", unit], capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise InjectError(f"systemctl start {unit} failed: {res.stderr.strip()}")
    else:
        log_path = Path(cfg.injector.access_log).with_name("injector.log")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as logf:
            lib = str(Path(__file__).resolve().parents[1])
            code = f"import sys; sys.path.insert(0, {lib!r}); from kooi.cli import main; sys.exit(main())"
            subprocess.Popen([sys.executable, "-I", "-c", code, "secrets", "serve"], stdin=subprocess.DEVNULL,
                             stdout=logf, stderr=logf, start_new_session=True, close_fds=True,
                             cwd="/", env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if status(cfg)["up"]:
            return True
        time.sleep(0.2)
    raise InjectError(f"the injector did not answer within {timeout:.0f} s; see "
                      f"{Path(cfg.injector.access_log).with_name('injector.log')}")


def stop(cfg: SecretsConfig, timeout: float = 10.0) -> bool:
    if os.geteuid() != 0:
        raise InjectError("kooi secrets stop needs root")
    try:
        pid = int(Path(cfg.injector.pid_file).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    if not status(cfg)["up"]:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    return True
