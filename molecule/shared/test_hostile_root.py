"""The hostile suite, root's own commands (issue 29, findings 9 and 10): once a workload
has the runner's uid, the runner's files are the attacker's. Root's `kooi verify` must
run none of the runner's code (a .pth file in ~/.local ran during a check and could type
into root's terminal), and root's `kooi gc` must follow none of the runner's links (the
run directory's `logs` or `shadows` pointed at a root directory: root's files deleted).
Runs on this machine (local end-to-end stage, `--hosts=local://`) and the userns-remap
test host (Molecule's verify)."""

from __future__ import annotations

import shlex

import pytest

from kooi.checks import Context

RUNS = "/var/lib/kooi/runs"
ROOT_DIR = "/var/tmp/kooi-hostile-root"  # root's own, what the attacker points at


@pytest.fixture(scope="module")
def ctx(host):
    return Context.from_host(host)


def as_runner(host, ctx, cmd: str):
    return host.run(f"runuser -u {ctx.runner} -- sh -c {shlex.quote(cmd)}")


def test_root_verify_runs_no_code_of_the_runners(host, ctx):
    home = ctx.engine.runner_home
    site = as_runner(host, ctx, "python3 -c 'import site; print(site.getusersitepackages())'").stdout.strip()
    assert site.startswith(home), site
    marker = f"{home}/kooi-hostile-pth-ran"
    pth = "import os; open(os.path.expanduser('~/kooi-hostile-pth-ran'), 'w').write(str(os.getsid(0)))\n"
    host.run(f"rm -f {marker}")
    assert as_runner(host, ctx, f"mkdir -p {site} && printf %s {shlex.quote(pth)} > {site}/kooi-hostile.pth").succeeded
    try:
        # Checks that run Python (and a shell) as the runner.
        res = host.run("kooi verify --check HOST-ROOTFUL-SOCKET --check HOST-FUSE --check NET-EGRESS-CONFINED "
                       "--check POL-EGRESS")
        assert "HOST-ROOTFUL-SOCKET" in res.stdout, res.stdout + res.stderr
        assert not host.file(marker).exists, (
            "a .pth file in the runner's ~/.local ran during root's kooi verify: " + host.file(marker).content_string)
    finally:
        host.run(f"rm -f {site}/kooi-hostile.pth {marker}")


@pytest.mark.parametrize("sub", ["logs", "shadows"])
def test_root_gc_follows_no_link_of_the_runners(host, ctx, sub):
    """The runner (here: the attacker) replaces RUNS/SUB with a link to a root
    directory holding old entries; root's kooi gc must leave them."""
    host.run(f"rm -rf {ROOT_DIR} && mkdir -p {ROOT_DIR}/old-dir && echo root > {ROOT_DIR}/old-file "
             f"&& echo root > {ROOT_DIR}/old-dir/x && touch -d '30 days ago' {ROOT_DIR}/old-file "
             f"{ROOT_DIR}/old-dir/x {ROOT_DIR}/old-dir && chmod 0755 {ROOT_DIR}")
    moved = as_runner(host, ctx, f"cd {RUNS} && mv {sub} {sub}.hostile-saved && ln -s {ROOT_DIR} {sub}")
    assert moved.succeeded, f"the runner could not replace {RUNS}/{sub}: {moved.stderr}"
    try:
        res = host.run("kooi gc")
        assert host.file(f"{ROOT_DIR}/old-file").exists and host.file(f"{ROOT_DIR}/old-dir/x").exists, (
            f"root's kooi gc deleted root's files through the runner's link {RUNS}/{sub}: {res.stdout} {res.stderr}")
        assert f"{sub}: {RUNS}/{sub} not swept" in res.stdout + res.stderr, res.stdout + res.stderr
    finally:
        host.run(f"cd {RUNS} && rm -f {sub} && mv {sub}.hostile-saved {sub}; rm -rf {ROOT_DIR}")


def test_root_verify_reads_the_runners_files_as_the_runner(host, ctx):
    """Issue 29, finding 11: root's checks print the end of a run's log (in the runner's
    run directory) as evidence; a log the runner turned into a link to a file only root
    may read printed that file. Logs are read as the runner now."""
    link = f"{ctx.engine.runner_home}/kooi-hostile-log-link"
    assert as_runner(host, ctx, f"ln -sfn /etc/shadow {link}").succeeded
    try:
        assert "root:" in host.file(link).content_string  # what root itself would read
        assert ctx.runner_text(host, link) == ""
        assert '"runner_user"' in ctx.runner_text(host, "/etc/kooi/engine.json")  # what the runner may read
    finally:
        host.run(f"rm -f {link}")


# Review 17 (F4): root's `kooi run --json RUNS/runcheck-result.json` made its temporary
# file in the runner's run directory; the runner swapped a forged result onto that name,
# root renamed it into place and printed its `log` raw: RUN-RESULT passed on the runner's
# word, and an OSC title, an erase-line and a carriage return reached root's terminal.
RACER = r"""
import json, os, sys, time
runs, marker = sys.argv[1], sys.argv[2]
forged = {"schema": 1, "run_id": "forged", "exit_code": 0, "reason": "ok", "log": marker + "\x1b]0;T\x07\x1b[2K\r"}
end = time.time() + 240
while time.time() < end and not os.path.exists(runs + "/.kooi-hostile-racer-stop"):
    for n in os.listdir(runs):
        if n.startswith(".runcheck-") and n.endswith(".tmp"):
            tmp = os.path.join(runs, ".kooi-hostile-forged")
            with open(tmp, "w") as f:
                json.dump(forged, f)
            try:
                os.replace(tmp, os.path.join(runs, n))
                print("SWAPPED", n, flush=True)
            except OSError:
                pass
    time.sleep(0.005)
"""


def test_the_runner_cannot_forge_what_root_verify_reports(host, ctx):
    marker = "KOOI-HOSTILE-FORGED-RESULT"
    host.run(f"rm -f {RUNS}/.kooi-hostile-racer-stop")
    racer = f"{RUNS}/.kooi-hostile-racer.py"
    assert as_runner(host, ctx, f"printf %s {shlex.quote(RACER)} > {racer}").succeeded
    host.run(f"runuser -u {ctx.runner} -- setsid -f python3 {racer} {RUNS} {marker} "
             f"> {RUNS}/.kooi-hostile-racer.out 2>&1 < /dev/null")
    try:
        res = host.run("kooi verify --check RUN-RESULT")
    finally:
        as_runner(host, ctx, f"touch {RUNS}/.kooi-hostile-racer-stop")
        host.run(f"sleep 0.2; rm -f {RUNS}/.kooi-hostile-racer* {RUNS}/.kooi-hostile-forged")
    out = res.stdout + res.stderr
    assert marker not in out and "\x1b" not in out, out
    assert "PASS RUN-RESULT" in out, out
