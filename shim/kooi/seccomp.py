"""kooi's own seccomp filter, stacked on whatever the engine applies.

Docker's default profile confines containers, but the one in Debian 12 (docker.io
20.10) still lets io_uring through, and a bubblewrap jail has no seccomp filter at
all. This filter refuses the kernel interfaces behind most escapes and kernel exploits:
io_uring (ENOSYS, so runtimes fall back to ordinary I/O), bpf, perf_event_open,
userfaultfd, open_by_handle_at/name_to_handle_at, module loading, kexec, the keyring,
mount and the new mount API, pivot_root, swap, reboot, acct, quotactl, unshare/setns,
ptrace and process_vm_readv/writev (unless a workflow opts in for a debugger: this
kernel has no Yama, so any process of the same uid could otherwise be traced, docker
exec'd ones included) and clone with any CLONE_NEW* flag (clone3 answers ENOSYS so the C library falls back
to clone, whose flags a filter can read). Other architectures' system calls (i386,
x32) are refused outright. Everything else is the engine's (or the kernel's) to decide.

Filters stack: a process can only add restrictions, never lift them, and the last
installed filter's errno wins among equal verdicts — hence kooi's distinct ENOSYS for
io_uring shows in the evidence that this filter, not the engine's, answered.

Self-contained (standard library only): jails get `program()` through
`bwrap --seccomp FD`; containers of kooi's runner image run this file's source with
the image's python3, which installs the filter and executes the workload:

    python3 -I -S -c "$(cat seccomp.py)" -- [--deadline SECONDS [--idle SECONDS]] [--nice N] [--debugger] COMMAND...

With --deadline, as the container's pid 1 (instead of the engine's init), it is also
the run's deadline that does not depend on `kooi run`: it forks the workload (which
alone gets the filter), forwards signals to it, reaps every orphan, and exits with its
exit code; SECONDS after it started, it kills every process of the container and exits
124, which ends the container. When the workload ends it kills what the workload left
and then says, on the container's last line of output, which cgroup limit the
container reached (pids, memory), if any. Nothing inside can stop that: a namespace's init gets
no signal it has no handler for (SIGSTOP, SIGKILL) from inside, and it is not
dumpable, so the workload (same uid) can neither ptrace it nor write its memory.

With --idle (a session's idle timeout), the init also ends the container once, for that
long, nothing entered it (no process whose parent is outside the container: `docker
exec`, which is how every terminal and command reaches a session) and its processes
used less than IDLE_CPU of a CPU; it says so on a line of its own.
"""

import errno
import os
import struct
import sys

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000
# name: (x86_64, aarch64)
DENIED = {
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142), "acct": (163, 89),
    "quotactl": (179, 60), "unshare": (272, 97), "setns": (308, 268),
}
# Another process's memory and execution (same uid; this kernel has no Yama): refused
# unless the workflow opts in for a debugger (`debugger: true`).
DEBUG = {"ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271)}
NOT_IMPLEMENTED = {
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "clone3": (435, 435),
}
CLONE = (56, 220)
# CLONE_NEWTIME | CLONE_NEWNS | CLONE_NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NEW_FLAGS = 0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 \
    | 0x20000000 | 0x40000000

_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000


def program(machine: str | None = None, debugger: bool = False) -> bytes:
    """The filter as a classic BPF program (struct sock_filter[]), for MACHINE
    (default: this one); DEBUGGER: ptrace and process_vm_* allowed. ValueError for an
    architecture kooi has no table for."""
    machine = machine or os.uname().machine
    if machine not in AUDIT_ARCH:
        raise ValueError(f"kooi's seccomp filter has no system call table for {machine}")
    col = 0 if machine == "x86_64" else 1
    ins: list[tuple[int, int | str, int | str, int]] = [  # (code, jt, jf, k): a jump is an offset or a label
        (_LD_ABS, 0, 0, 4),                                  # seccomp_data.arch
        (_JEQ, 0, "deny", AUDIT_ARCH[machine]),
        (_LD_ABS, 0, 0, 0),                                  # seccomp_data.nr
    ]
    if machine == "x86_64":
        ins.append((_JGE, "deny", 0, X32_SYSCALL_BIT))
    ins.append((_JEQ, "clone", 0, CLONE[col]))
    ins += [(_JEQ, "enosys", 0, nrs[col]) for nrs in NOT_IMPLEMENTED.values()]
    ins += [(_JEQ, "deny", 0, nrs[col]) for nrs in DENIED.values()]
    if not debugger:
        ins += [(_JEQ, "deny", 0, nrs[col]) for nrs in DEBUG.values()]
    ins.append((_RET, 0, 0, RET_ALLOW))
    labels = {"clone": len(ins)}
    ins += [(_LD_ABS, 0, 0, 16),                             # args[0] (flags), low 32 bits
            (_JSET, "deny", 0, CLONE_NEW_FLAGS),
            (_RET, 0, 0, RET_ALLOW)]
    labels["deny"] = len(ins)
    ins.append((_RET, 0, 0, RET_ERRNO | errno.EPERM))
    labels["enosys"] = len(ins)
    ins.append((_RET, 0, 0, RET_ERRNO | errno.ENOSYS))
    out = b""
    for i, (code, jt, jf, k) in enumerate(ins):
        jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
        assert 0 <= jt < 256 and 0 <= jf < 256
        out += struct.pack("<HBBI", code, jt, jf, k)
    return out


def install(prog: bytes | None = None) -> None:
    """Install the filter on this process (and everything it executes). Sets
    no_new_privs first, as the kernel requires of an unprivileged caller."""
    import ctypes  # here, not at the top: the host only compiles the program

    class _SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = prog if prog is not None else program()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = _SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    for option, arg, ptr in ((38, 1, None), (22, 2, ctypes.addressof(fprog))):  # NO_NEW_PRIVS; SECCOMP FILTER
        if libc.prctl(option, arg, ptr, 0, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"prctl({option}): {os.strerror(e)}")


def _exec(argv: list[str], nice: int = 0, debugger: bool = False) -> None:
    try:
        if nice:
            os.nice(nice)
        install(program(debugger=debugger))
    except (OSError, ValueError) as exc:
        print(f"kooi: cannot install kooi's seccomp filter: {exc}", file=sys.stderr)
        os._exit(125)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"kooi: {argv[0]}: {exc.strerror}", file=sys.stderr)
        os._exit(127 if exc.errno == errno.ENOENT else 126)


# The cgroup's own record of refusals (v2, then v1 where each controller is a mount):
# the init reads them when the workload has ended and says which limit it reached.
LIMIT_EVENTS = (("/sys/fs/cgroup/pids.events", "max", "pids"), ("/sys/fs/cgroup/pids/pids.events", "max", "pids"),
                ("/sys/fs/cgroup/memory.events", "oom_kill", "memory"),
                ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill", "memory"))
LIMIT_MARK = "kooi: limit reached: "
# The run's secret for the init's report (kooi run sets it in the container's
# environment; the init takes it out before the workload starts and is not dumpable, so
# the workload can neither read it nor print a report of its own that kooi would take).
TOKEN_ENV = "KOOI_INIT_TOKEN"


def limit_mark(token: str) -> str:
    """The start of the init's limit report for a run whose secret is TOKEN."""
    return f"{LIMIT_MARK[:-2]} [{token}]: " if token else LIMIT_MARK


def _read(path: str) -> str | None:
    """PATH's text, None where it cannot be read."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _proc_stat(pid: str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...), None
    where the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def limits_reached(events: tuple[tuple[str, str, str], ...] = LIMIT_EVENTS) -> list[str]:
    """The limits (pids, memory) whose counter in EVENTS ((file, key, limit) rows) is
    above 0; files that cannot be read are skipped."""
    hits: list[str] = []
    for path, key, name in events:
        if (text := _read(path)) is None:
            continue
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k == key and v.strip().isdigit() and int(v) > 0 and name not in hits:
                hits.append(name)
    return hits


def _end_the_rest() -> None:
    """As pid 1: kill every other process of the container and reap them all, so that
    nothing writes after the limit report. One kill(-1) is not enough against a fork
    bomb: a child forked while the kill walks the process list survives it."""
    import signal
    import time

    for _ in range(200):
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass  # ESRCH: nothing left to signal
        try:
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        except ChildProcessError:
            return  # every orphan is this init's child: none left
        time.sleep(0.01)


_TOKEN = ""  # the run's secret (TOKEN_ENV), taken out of the environment by init()


def _report_limits() -> None:
    hits = limits_reached()
    if hits:
        os.write(2, f"{limit_mark(_TOKEN)}{' '.join(hits)}\n".encode())


IDLE_MARK = "kooi: idle: "
IDLE_CPU = 0.02  # below this share of one CPU a container counts as idle


def idle_mark(token: str) -> str:
    """The start of the init's idle report for a session whose secret is TOKEN."""
    return f"{IDLE_MARK[:-2]} [{token}]: " if token else IDLE_MARK


def entered() -> bool:
    """Whether a process of this pid namespace other than its init has a parent outside
    it (ppid 0): something entered the container (docker exec), and is still there."""
    for name in os.listdir("/proc"):
        if name.isdigit() and name != "1" and (fields := _proc_stat(name)) and len(fields) > 1 \
                and fields[1] == b"0":
            return True
    return False


def cpu_seconds() -> float:
    """CPU time the container's processes have used: the sum over the processes of its
    pid namespace, with their reaped children's. Not the cgroup's account: where the
    engine gives the container no cgroup of its own (cgroup v1, or the rootless engine
    without delegated controllers) those files are the host's, and a session on a busy
    machine never went idle. A process whose parent does not wait for it takes its time
    with it; the measure is for a session nobody is in (entered), where that is rare."""
    total, tick = 0, os.sysconf("SC_CLK_TCK")
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _proc_stat(name)):
            total += sum(int(x) for x in fields[11:15] if x.isdigit())  # utime stime cutime cstime
    return total / tick


FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH", "SIGCONT")


def init(deadline: float, argv: list[str], nice: int = 0, debugger: bool = False, idle: float | None = None) -> None:
    """pid 1 of the workload's container: the workload as its child, the deadline, and
    (IDLE) a session's idle timeout."""
    import ctypes
    import signal
    import time

    global _TOKEN
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0: no ptrace, no /proc/1/mem, /proc/1/environ
        print("kooi: cannot make the init undumpable", file=sys.stderr)
        sys.exit(125)
    _TOKEN = os.environ.pop(TOKEN_ENV, "")  # the workload's environment goes without it
    child = os.fork()
    if child == 0:
        _exec(argv, nice, debugger)
    for name in FORWARDED:
        signal.signal(getattr(signal, name), lambda sig, _f: os.kill(child, sig))
    started = time.monotonic()
    every = min(30.0, idle / 3) if idle else deadline
    quiet_since, used = started, cpu_seconds() if idle else 0.0

    def end(line: str, code: int) -> None:
        os.write(2, line.encode())
        try:
            _end_the_rest()  # every process of the container but this one
        finally:
            _report_limits()
            os._exit(code)

    def tick(_sig: int, _f: object) -> None:
        nonlocal quiet_since, used
        now = time.monotonic()
        if now - started >= deadline - 0.001:
            end(f"kooi: the run's deadline of {deadline:.0f} s passed; every process is killed\n", 124)
        if idle:
            before, used = used, cpu_seconds()
            if entered() or used - before > IDLE_CPU * every:
                quiet_since = now
            elif now - quiet_since >= idle:
                end(f"{idle_mark(_TOKEN)}nothing entered the session and it used no CPU for {idle:.0f} s; "
                    "every process is killed\n", 0)
        signal.setitimer(signal.ITIMER_REAL, max(0.01, min(every, deadline - (now - started))))

    signal.signal(signal.SIGALRM, tick)
    signal.setitimer(signal.ITIMER_REAL, min(every, deadline))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(0)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            # The workload has ended: what it left goes now (the namespace would take it
            # when this init exits anyway), so that the report is the last word.
            _end_the_rest()
            _report_limits()
            os._exit(code if code >= 0 else 128 - code)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    deadline, nice, debugger, idle = None, 0, False, None
    while argv[:1] in (["--deadline"], ["--idle"], ["--nice"], ["--debugger"]):
        if argv[0] == "--debugger":
            debugger, argv = True, argv[1:]
            continue
        if len(argv) < 2:
            break
        if argv[0] == "--deadline":
            deadline = float(argv[1])
        elif argv[0] == "--idle":
            idle = float(argv[1])
        else:
            nice = int(argv[1])
        argv = argv[2:]
    if not argv:
        sys.exit("usage: python3 -c \"$(cat seccomp.py)\" -- [--deadline SECONDS [--idle SECONDS]] [--nice N] [--debugger] "
                 "COMMAND...")
    if deadline is not None and os.getpid() == 1:
        init(deadline, argv, nice, debugger, idle)
    _exec(argv, nice, debugger)


if __name__ == "__main__":
    main(sys.argv[1:])
