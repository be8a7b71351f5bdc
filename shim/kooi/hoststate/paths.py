"""kooi's fixed places on a host: the one table the shim and the checks use.

These are not settings. The shim reads them without being told where they are (a
workload-facing program takes no path to its own policy from its caller), and dockerd
finds the authorization plugin by the name of its socket. The roles use the same table
as the role variable `kooi_paths` (roles/kooi_defaults/vars/main.yml);
tests/unit/test_paths.py fails when the two differ. Where kooi's command is installed
is a setting (kooi_bin); engine.json records it for the checks.
"""

from __future__ import annotations

ETC = "/etc/kooi"
ENGINE = f"{ETC}/engine.json"
ENGINE_DIR = f"{ETC}/engine"
IMAGES = f"{ETC}/images.json"
IMAGE_LOCK = f"{ETC}/images/runner.lock.yml"
EGRESS = f"{ETC}/egress.json"
APPARMOR = f"{ETC}/apparmor.json"
FUSE = f"{ETC}/fuse.json"
LIMITS = f"{ETC}/limits.json"
SECRETS = f"{ETC}/secrets.json"
SECRETS_DIR = f"{ETC}/secrets"
SSH = f"{ETC}/ssh.json"  # the SSH entry into sessions: persons, their keys (roles/session_ssh)
SSH_KEYS = f"{ETC}/ssh/authorized_keys"  # the keys sshd takes for the login account
INJECT_RUN_DIR = "/run/kooi-inject"
INJECT_CONTROL = f"{INJECT_RUN_DIR}/control.sock"
INJECT_LOG_DIR = "/var/log/kooi/inject"
WORKFLOWS = f"{ETC}/workflows"
SECCOMP_DIR = f"{ETC}/seccomp"
AUTHZ_TOKEN = f"{ETC}/authz/token"
AUTHZ_PLUGIN = "kooi-authz"
AUTHZ_SOCKET = f"/run/docker/plugins/{AUTHZ_PLUGIN}.sock"
RUNS = "/var/lib/kooi/runs"
BROKERS = f"{RUNS}/brokers"
EGRESS_SETTINGS = f"{RUNS}/egress"
SHADOWS = f"{RUNS}/shadows"  # throwaway git directories of runs (run.guard)
SELFTEST_PROJECT = f"{RUNS}/selftest-project"
RUNCHECK_PROJECT = f"{RUNS}/runcheck-project"
LOG_DIR = "/var/log/kooi"
# Where `kooi engine start` records the pid of an engine it started (no systemd).
ENGINE_STATE_DIR = "/run/kooi"
# The default of kooi_bin.
BIN = "/usr/local/bin/kooi"

ALL: dict[str, str] = {
    "etc": ETC, "engine": ENGINE, "engine_dir": ENGINE_DIR, "images": IMAGES,
    "image_lock": IMAGE_LOCK, "egress": EGRESS, "apparmor": APPARMOR, "fuse": FUSE, "limits": LIMITS,
    "secrets": SECRETS, "secrets_dir": SECRETS_DIR, "ssh": SSH, "ssh_keys": SSH_KEYS,
    "inject_run_dir": INJECT_RUN_DIR,
    "inject_control": INJECT_CONTROL, "inject_log_dir": INJECT_LOG_DIR,
    "workflows": WORKFLOWS, "seccomp_dir": SECCOMP_DIR, "authz_token": AUTHZ_TOKEN,
    "authz_plugin": AUTHZ_PLUGIN, "authz_socket": AUTHZ_SOCKET, "runs": RUNS,
    "brokers": BROKERS, "egress_settings": EGRESS_SETTINGS, "shadows": SHADOWS,
    "selftest_project": SELFTEST_PROJECT, "runcheck_project": RUNCHECK_PROJECT,
    "log_dir": LOG_DIR, "engine_state_dir": ENGINE_STATE_DIR,
}
