"""kooi's seccomp filter: the program's verdicts for every branch (a classic BPF
interpreter reads the bytes the kernel gets), and the real kernel applying it."""

from __future__ import annotations

import errno
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kooi import seccomp

ALLOW, ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOSYS = ERRNO | errno.EPERM, ERRNO | errno.ENOSYS


def evaluate(prog: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """Run PROG (struct sock_filter[]) on a seccomp_data the way the kernel does for
    the instructions kooi emits (absolute word loads, jeq/jge/jset with constants, ret)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    ins = [struct.unpack_from("<HBBI", prog, i) for i in range(0, len(prog), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = ins[pc]
        pc += 1
        if code == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code in (0x15, 0x35, 0x45):
            hit = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
            pc += jt if hit else jf
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
@pytest.mark.parametrize("debugger", [False, True])
def test_every_listed_call_is_refused_and_others_allowed(machine, debugger):
    prog, col = seccomp.program(machine, debugger=debugger), (0 if machine == "x86_64" else 1)
    arch = seccomp.AUDIT_ARCH[machine]
    assert len(prog) % 8 == 0 and len(prog) // 8 < 4096
    for name, nrs in seccomp.DENIED.items():
        assert evaluate(prog, nrs[col], arch) == EPERM, name
    for name, nrs in seccomp.DEBUG.items():  # ptrace and process_vm_*: only a debugger workflow's
        assert evaluate(prog, nrs[col], arch) == (ALLOW if debugger else EPERM), name
    for name, nrs in seccomp.NOT_IMPLEMENTED.items():
        assert evaluate(prog, nrs[col], arch) == ENOSYS, name
    listed = {n[col] for n in (*seccomp.DENIED.values(), *seccomp.NOT_IMPLEMENTED.values(),
                               *seccomp.DEBUG.values())}
    clone = seccomp.CLONE[col]
    for nr in range(0, 460):
        if nr not in listed and nr != clone:
            assert evaluate(prog, nr, arch) == ALLOW, nr


@settings(deadline=None, max_examples=300)
@given(flags=st.integers(min_value=0, max_value=2**64 - 1), machine=st.sampled_from(["x86_64", "aarch64"]))
def test_clone_is_refused_exactly_when_it_asks_for_a_namespace(flags, machine):
    col = 0 if machine == "x86_64" else 1
    got = evaluate(seccomp.program(machine), seccomp.CLONE[col], seccomp.AUDIT_ARCH[machine], (flags,))
    assert got == (EPERM if flags & seccomp.CLONE_NEW_FLAGS else ALLOW)


def test_other_abis_are_refused():
    prog = seccomp.program("x86_64")
    assert evaluate(prog, 39, 0x40000003) == EPERM                 # i386 (int 0x80): getpid
    assert evaluate(prog, 39 | seccomp.X32_SYSCALL_BIT, seccomp.AUDIT_ARCH["x86_64"]) == EPERM   # x32
    assert evaluate(seccomp.program("aarch64"), 20, 0x40000028) == EPERM    # arm32 compat


def test_unknown_architectures_are_a_clear_error():
    with pytest.raises(ValueError, match="no system call table for riscv64"):
        seccomp.program("riscv64")


PROBE = textwrap.dedent("""
    import ctypes, errno, os, subprocess, threading
    libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long
    def call(nr, *a):
        r = libc.syscall(nr, *[ctypes.c_long(x) for x in a]); e = ctypes.get_errno()
        return "ok" if r >= 0 else errno.errorcode.get(e, str(e))
    t = threading.Thread(target=lambda: None); t.start(); t.join()
    print(call(425, 1, 0), call(321, 5, 0, 0), call(272, 0x10000000), call(165, 0, 0, 0, 0, 0),
          call(39), subprocess.run(["true"]).returncode)
""")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe uses x86_64 system call numbers")
def test_the_kernel_applies_it_to_the_command_and_its_children():
    """Without the filter io_uring_setup reaches the kernel (EFAULT for its NULL
    argument); under it io_uring answers ENOSYS, bpf/unshare/mount EPERM, and ordinary
    work (threads, fork and exec) goes on."""
    src = Path(seccomp.__file__).read_text()
    plain = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    assert plain.stdout.split()[0] == "EFAULT", plain.stdout
    res = subprocess.run([sys.executable, "-I", "-S", "-c", src, "--", sys.executable, "-c", PROBE],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["ENOSYS", "EPERM", "EPERM", "EPERM", "ok", "0"]


def test_a_missing_command_is_127_with_a_message():
    res = subprocess.run([sys.executable, "-I", "-c", Path(seccomp.__file__).read_text(), "--", "no-such-cmd-kooi"],
                         capture_output=True, text=True)
    assert res.returncode == 127 and "no-such-cmd-kooi" in res.stderr
