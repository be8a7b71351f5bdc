"""Negative controls: each deliberate misconfiguration makes exactly its checks fail.

A check that nothing can make fail proves nothing. Each test breaks one thing on a
provisioned test host, runs the catalogue there as an operator would (`kooi verify
--format json` on the host; its exit code must agree with the report), asserts that
the expected checks fail and every other one still passes, and restores the host.

The baseline runs the whole catalogue. Each control runs every check of scope "host"
(kooi.checks.core.Check.scope): the "workload" ones start the self-test, probe
containers or kooi runs and dominate each catalogue run (the controls took 17 minutes per
scenario with them, and 20 to 27 s each on a userns-remap host with gVisor while
ESC-PTRACE's two self-tests still ran), and no host misconfiguration here changes what
a workload of the running engine sees. Their own negative controls: the self-test's
program run unconfined, the engine without kooi's seccomp profile, a leftover run
container (tests/e2e/test_verify.py) and a setuid shell in the image (below). The
"image" ones (IMG-NOSUID, IMG-FILECAPS) scan the pinned image's files in a container of
it; they run where the pinned image is what a control changes.
"""

from __future__ import annotations

import contextlib
import json
import shlex

import pytest

from kooi.checks import CHECKS, Context
from kooi.checks.core import FAIL


@pytest.fixture(scope="module")
def ctx(host):
    return Context.from_host(host)


@contextlib.contextmanager
def backup(host, path):
    host.run(f"cp -a {path} {path}.kooi-neg")
    try:
        yield
    finally:
        host.run(f"mv -f {path}.kooi-neg {path}")


def verify_on_host(host, ids: list[str] | None = None) -> dict[str, dict]:
    """`kooi verify --format json` run on the test host itself, as an operator runs it
    (the same catalogue as the testinfra run, without a `docker exec` per command: the
    controls took 7 minutes per scenario that way): {id: check} of IDS (all when None).
    Its exit code must say what the report says: 0 when no check fails, else 1."""
    checks = " ".join(f"--check {i}" for i in ids or [])
    res = host.run(f"/usr/local/bin/kooi verify --format json {checks}")
    assert res.rc in (0, 1), f"kooi verify: rc {res.rc}: {res.stdout[-2000:]} {res.stderr[-2000:]}"
    report = json.loads(res.stdout)
    got = {c["id"]: c for c in report["checks"]}
    for c in got.values():  # the evidence, in the report of a failed test (-rA)
        if c["status"] == FAIL:
            print(f"FAIL {c['id']}: {c['evidence']}")
    assert list(got) == (ids or [c.id for c in CHECKS]), list(got)
    assert res.rc == (1 if any(c["status"] == FAIL for c in got.values()) else 0), res.rc
    return got


def failing(host, image: bool = False) -> set[str]:
    """The failing checks among the host ones (and, with IMAGE, the image scans)."""
    scopes = ("host", "image") if image else ("host",)
    ids = [c.id for c in CHECKS if c.scope in scopes]
    return {i for i, c in verify_on_host(host, ids).items() if c["status"] == FAIL}


@pytest.fixture(scope="module")
def baseline(host) -> dict[str, dict]:
    """The whole catalogue on the host as provisioned (the in-workload checks dominate
    it: run once for the two tests that read it)."""
    return verify_on_host(host)


def test_baseline_passes(baseline):
    assert {i for i, c in baseline.items() if c["status"] == FAIL} == set()


def test_runner_in_group_docker(host, ctx):
    host.run("getent group docker >/dev/null || groupadd docker")
    assert host.run(f"gpasswd -a {ctx.runner} docker").rc == 0
    try:
        assert failing(host) == {"HOST-RUNNER-NODOCKER"}
    finally:
        host.run(f"gpasswd -d {ctx.runner} docker")


def test_runner_with_sudo(host, ctx):
    host.run(f"echo '{ctx.runner} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/kooi-negative")
    try:
        assert failing(host) == {"HOST-RUNNER-NOSUDO"}
    finally:
        host.run("rm -f /etc/sudoers.d/kooi-negative")


def test_duplicate_subuid_range(host, ctx):
    with backup(host, "/etc/subuid"):
        host.run(f"echo '{ctx.runner}:900000:65536' >> /etc/subuid")
        # A range the egress rules do not know is a way out as well.
        assert failing(host) == {"HOST-SUBID-RANGES", "NET-EGRESS-RULES"}


def test_overlapping_subuid_range(host, ctx):
    line = [l for l in host.file("/etc/subuid").content_string.splitlines()
            if l.startswith(ctx.runner + ":")][0]
    start = int(line.split(":")[1])
    with backup(host, "/etc/subuid"):
        host.run(f"echo 'intruder:{start + 1000}:65536' >> /etc/subuid")
        assert failing(host) == {"HOST-SUBID-NOOVERLAP"}


def test_world_writable_daemon_config(host, ctx):
    path = shlex.quote(ctx.engine.daemon_config)
    mode = host.file(ctx.engine.daemon_config).mode
    host.run(f"chmod 0666 {path}")
    try:
        assert failing(host) == {"HOST-ENGINE-FILES"}
    finally:
        host.run(f"chmod {mode:o} {path}")


def test_daemon_without_no_new_privileges(host, ctx):
    path = ctx.engine.daemon_config
    with backup(host, path):
        host.run(f"sed -i 's/\"no-new-privileges\": true/\"no-new-privileges\": false/' {path}")
        assert failing(host) == {"HOST-DAEMON-SETTINGS"}


def _pinned(host) -> dict | None:
    f = host.file("/etc/kooi/images.json")
    if not f.exists:
        return None
    import json
    return json.loads(f.content_string).get("runner")


def test_image_checks_apply_exactly_where_an_image_is_pinned(host, ctx, baseline):
    # ID-APPARMOR is n/a on these test hosts whatever the image: their kernel has no
    # AppArmor; RUN-SECRETS-HIDDEN wherever the host holds no inject secrets;
    # ID-GVISOR-KERNEL wherever the engine has no gVisor.
    # RUN-EGRESS-OWN-WAY where the host has no egress control.
    other = ("ID-APPARMOR", "RUN-SECRETS-HIDDEN") + (() if ctx.engine.gvisor else ("ID-GVISOR-KERNEL",)) \
        + (() if ctx.engine.egress else ("RUN-EGRESS-OWN-WAY",))
    status = {i: c["status"] for i, c in baseline.items()
              if i.startswith(("IMG-", "ID-", "RUN-")) and i not in other}
    assert len(status) == len([c for c in CHECKS if c.id.startswith(("IMG-", "ID-", "RUN-"))
                               and c.id not in other]) >= 15
    want = "pass" if _pinned(host) else "na"
    assert set(status.values()) == {want}, status


def builder(ctx, cmd: str) -> str:
    """Who may build on this engine: the runner, or behind kooi's authorization plugin
    only the operator (root with the root-only token, as site.yml's builds)."""
    authz = ctx.engine.authz
    if not authz:
        return ctx.as_runner(cmd)
    return ("d=$(mktemp -d) && python3 -c 'import json,sys; print(json.dumps({\"HttpHeaders\": "
            "{\"X-Kooi-Token\": open(sys.argv[1]).read().strip()}}))' "
            f"{shlex.quote(authz.token_file)} > $d/config.json && "
            f"DOCKER_CONFIG=$d DOCKER_HOST=unix://{ctx.engine.socket} sh -c {shlex.quote(cmd)}; "
            "rc=$?; rm -rf $d; exit $rc")


def test_setuid_file_in_the_pinned_image(host, ctx):
    pin = _pinned(host)
    if pin is None:  # covered above: IMG-* are n/a on hosts that build no image
        return
    bad = "kooi-negative:setuid"
    build = (f"printf 'FROM {pin['id']}\\nUSER 0\\nRUN chmod u+s /usr/bin/find\\nUSER 1000:1000\\n' | "
             f"docker build -q -t {bad} - >/dev/null && docker image inspect -f '{{{{.Id}}}}' {bad}")
    res = host.run(builder(ctx, f"DOCKER_BUILDKIT=0 sh -c {shlex.quote(build)}"))
    assert res.rc == 0, res.stderr
    bad_id = res.stdout.strip()
    with backup(host, "/etc/kooi/images.json"):
        host.run(f"sed -i 's/{pin['id']}/{bad_id}/' /etc/kooi/images.json")
        try:
            failed = failing(host, image=True)
        finally:
            host.run("mv -f /etc/kooi/images.json.kooi-neg /etc/kooi/images.json && cp -a /etc/kooi/images.json "
                     "/etc/kooi/images.json.kooi-neg")
    host.run(ctx.as_runner(f"docker rmi -f {bad}"))
    assert "IMG-NOSUID" in failed, failed
    assert failed <= {"IMG-NOSUID", "IMG-DIGEST-PIN", "IMG-FILECAPS"}, failed


def test_authorization_plugin_down_fails_closed_and_is_reported(host, ctx):
    """With roles/authz: the plugin stopped makes POL-AUTHZ-PLUGIN fail, `kooi engine
    status` name the cause at once, and dockerd refuse calls; started again, dockerd
    (the same process) serves again. Elsewhere the POL-* checks are n/a."""
    pol = {i: c["status"] for i, c in verify_on_host(host, ["POL-AUTHZ-PLUGIN", "POL-AUTHZ-REFUSES"]).items()}
    if not ctx.engine.authz:
        assert set(pol.values()) == {"na"}, pol
        return
    assert set(pol.values()) == {"pass"}, pol
    dockerd = host.run("pidof dockerd").stdout.strip()
    assert host.run("systemctl stop kooi-authz.service").rc == 0
    try:
        assert verify_on_host(host, ["POL-AUTHZ-PLUGIN"])["POL-AUTHZ-PLUGIN"]["status"] == FAIL
        st = host.run("timeout 20 /usr/local/bin/kooi engine status")
        assert st.rc != 0 and "authorization plugin kooi-authz is down" in st.stdout + st.stderr, st.stdout
        refused = host.run(ctx.as_runner("timeout 90 docker ps"))
        assert refused.rc != 0, refused.stdout
    finally:
        host.run("systemctl start kooi-authz.service")
    assert host.run("timeout 30 sh -c 'until /usr/local/bin/kooi authz health; do sleep 1; done'").rc == 0
    back = host.run(ctx.as_runner("docker ps -q"))
    assert back.rc == 0, back.stderr
    assert host.run("pidof dockerd").stdout.strip() == dockerd


def test_daemon_without_its_authorization_plugin_lets_privileged_requests_through(host, ctx):
    """A privileged request slipping past the policy: with roles/authz, daemon.json
    without kooi-authz and the daemon restarted, the runner's --privileged, host-mount
    and host-namespace requests reach the engine, and exactly the POL-AUTHZ-* checks
    fail. Without the plugin the check says why it does not apply."""
    if not ctx.engine.authz:
        res = verify_on_host(host, ["POL-AUTHZ-REFUSES"])["POL-AUTHZ-REFUSES"]
        why = "kooi_authz_enabled is false" if ctx.mode == "userns_remap" else "not applicable to engine mode"
        assert res["status"] == "na" and why in res["evidence"], res
        return
    path = ctx.engine.daemon_config
    unit = ctx.engine.systemd_unit or "docker.service"
    drop = ("import json,sys; p=sys.argv[1]; d=json.load(open(p)); d.pop('authorization-plugins'); "
            "open(p,'w').write(json.dumps(d, indent=2))")
    try:
        with backup(host, path):
            assert host.run(f"python3 -c {shlex.quote(drop)} {shlex.quote(path)}").rc == 0
            assert host.run(f"systemctl restart {unit}").rc == 0
            assert failing(host) == {"POL-AUTHZ-PLUGIN", "POL-AUTHZ-REFUSES"}
    finally:
        assert host.run(f"systemctl restart {unit}").rc == 0
    assert host.run(ctx.as_runner("timeout 60 sh -c 'until docker info >/dev/null 2>&1; do sleep 1; done'")).rc == 0
    assert {c["status"] for c in verify_on_host(host, ["POL-AUTHZ-PLUGIN", "POL-AUTHZ-REFUSES"]).values()} == {"pass"}


def egress(host) -> dict:
    f = host.file("/etc/kooi/egress.json")
    assert f.exists, "egress control is on by default and in every scenario: /etc/kooi/egress.json is missing"
    return json.loads(f.content_string)


def test_egress_rules_gone(host, ctx):
    eg = egress(host)
    assert host.run(f"nft delete table inet {eg['table']}").rc == 0
    try:
        assert failing(host) == {"NET-EGRESS-RULES", "NET-EGRESS-CONFINED"}
    finally:
        assert host.run(f"nft -f {shlex.quote(eg['rules_file'])}").rc == 0


def test_egress_rule_letting_the_runner_out(host, ctx):
    """An open egress rule: an accept for the runner's uid ahead of kooi's reject (as an
    operator's quick fix would add it). The table and its uid set are intact, the
    behaviour is not: NET-EGRESS-CONFINED, which tries the real connection, fails."""
    eg = egress(host)
    uid = int(ctx.engine.runner_uid)
    assert host.run(f"nft insert rule inet {eg['table']} output meta skuid {uid} accept").rc == 0
    try:
        assert failing(host) == {"NET-EGRESS-CONFINED"}
    finally:
        assert host.run(f"nft -f {shlex.quote(eg['rules_file'])}").rc == 0


def test_egress_allowlist_readable_by_all(host, ctx):
    eg = egress(host)
    path = shlex.quote(eg["allowlist"])
    host.run(f"chmod 0644 {path}; chmod 0755 $(dirname {path})")
    try:
        assert failing(host) == {"NET-EGRESS-PROXY", "POL-EGRESS"}
    finally:
        host.run(f"chmod 0640 {path}; chmod 0750 $(dirname {path})")


def test_egress_description_removed(host, ctx):
    """egress.json gone while engine.json records egress as meant to be on: every
    egress check fails (none calls itself "not applicable"), and a workflow that asks
    for the proxy is refused as unavailable instead of running without one."""
    egress(host)
    with backup(host, "/etc/kooi/egress.json"):
        host.run("rm -f /etc/kooi/egress.json")
        assert failing(host) == {"NET-EGRESS-RULES", "NET-EGRESS-CONFINED", "NET-EGRESS-PROXY", "POL-EGRESS"}
        res = verify_on_host(host, ["NET-EGRESS-RULES"])["NET-EGRESS-RULES"]
        assert "egress control is on for this host" in res["evidence"], res


def test_egress_proxy_stopped(host, ctx):
    egress(host)
    assert host.run("/usr/local/bin/kooi egress stop").rc == 0
    try:
        assert failing(host) == {"NET-EGRESS-CONFINED", "NET-EGRESS-PROXY"}
    finally:
        assert host.run("/usr/local/bin/kooi egress start").rc == 0


def test_apparmor_profile_in_complain_mode(host, ctx):
    # These test hosts' kernel has no AppArmor: the complain flag is caught on disk
    # (HOST-APPARMOR-PROFILES); the QEMU scenario proves the kernel side.
    path = "/etc/apparmor.d/kooi-runner"
    assert host.file(path).exists, "role apparmor runs in every scenario: kooi-runner is missing"
    with backup(host, path):
        assert host.run(f"sed -i 's/flags=(attach_disconnected,mediate_deleted)/"
                        f"flags=(attach_disconnected,mediate_deleted,complain)/' {path}").rc == 0
        assert failing(host) == {"HOST-APPARMOR-PROFILES"}


def test_apparmor_profile_writable_by_others(host, ctx):
    path = "/etc/apparmor.d/kooi-jail"
    with backup(host, path):
        host.run(f"chmod 0666 {path}")
        assert failing(host) == {"HOST-APPARMOR-PROFILES"}


def test_dev_fuse_open_to_everyone_without_the_opt_in(host, ctx):
    # The test hosts get the machine's /dev/fuse (role fuse made it root-only): open it
    # to everyone, as a host without kooi's rule would have it.
    dev = host.file("/dev/fuse")
    assert host.run("test -c /dev/fuse").rc == 0, "the scenario passes /dev/fuse to its test hosts"
    assert dev.mode & 0o006 == 0, f"role fuse left /dev/fuse {oct(dev.mode)} without the opt-in"
    host.run("chmod 0666 /dev/fuse")
    try:
        assert failing(host) == {"HOST-FUSE"}
    finally:
        host.run("chmod 0600 /dev/fuse")
