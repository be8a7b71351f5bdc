"""The forwarder kooi runs inside a jail that may use the egress proxy.

The jail has its own network namespace with only loopback. This program listens on
127.0.0.1:PORT there, starts the workload, relays every connection to the bridge's
unix socket (served outside by kooi run, see egress.JailBridge) and exits with the
workload's status. Self-contained (standard library only): kooi run passes this
file's source to the host's python3 with -c, since the kooi package is not bound
into the jail.

Usage: python3 -c "$(cat jailfwd.py)" BRIDGE_SOCKET PORT COMMAND...
"""

import os
import socket
import sys
import threading


def relay(a: socket.socket, b: socket.socket) -> None:
    """Copy A to B until A ends, then end B's writing side (the other direction
    goes on)."""
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def main(argv: list[str]) -> None:
    path, port, cmd = argv[0], int(argv[1]), argv[2:]
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(64)
    pid = os.fork()
    if pid == 0:
        srv.close()
        try:
            os.execvp(cmd[0], cmd)
        except OSError as exc:
            print(f"kooi: cannot run {cmd[0]}: {exc.strerror}", file=sys.stderr, flush=True)
            os._exit(127)

    def serve() -> None:
        while True:
            c, _ = srv.accept()
            u = socket.socket(socket.AF_UNIX)
            try:
                u.connect(path)
            except OSError:
                c.close()
                continue
            threading.Thread(target=relay, args=(c, u), daemon=True).start()
            threading.Thread(target=relay, args=(u, c), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main(sys.argv[1:])
