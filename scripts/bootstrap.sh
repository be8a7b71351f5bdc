#!/usr/bin/env bash
# Prepare a fresh Debian machine (as root) to run kooi and its tests:
# Debian packages, a Python venv with kooi and its tools in .venv, and a running
# Docker daemon (started here when no service manager runs one).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "bootstrap: run as root (it installs packages)" >&2; exit 2; }
export DEBIAN_FRONTEND=noninteractive
need=(docker.io rootlesskit uidmap slirp4netns dbus-user-session iproute2 debootstrap
      busybox-static python3 python3-venv python3-docker python3-yaml rsync sudo curl openssl)
missing=()
for p in "${need[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The test suite also boots QEMU guests (the AppArmor scenario: the only kernel here
# with AppArmor) and parses AppArmor profiles: scripts/test.sh sets KOOI_BOOTSTRAP_TESTS=1
# (=quick for `scripts/test.sh --quick`: no guest). Both check what the project guard
# does with Git LFS's objects (git-lfs).
if [ "${KOOI_BOOTSTRAP_TESTS:-0}" != 0 ]; then
  want=(git-lfs)
  [ "$KOOI_BOOTSTRAP_TESTS" = quick ] || want+=(qemu-system-x86 qemu-utils apparmor e2fsprogs openssh-client)
  missing=()
  for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "bootstrap: installing (tests) ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi
# The venv is built from Debian's python3, never from whatever python3 comes first in
# root's PATH (a pyenv or conda build under /root, which the runner user cannot read),
# and holds exactly requirements/dev.lock (versions and hashes; scripts/lock.sh refreshes it).
venv=$repo/.venv
stamp=$venv/.kooi-stamp
if [ ! -x "$venv/bin/molecule" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$(sha256sum "$repo/requirements/dev.lock" | cut -d' ' -f1)" ] \
   || ! grep -qx 'home = /usr/bin' "$venv/pyvenv.cfg" 2>/dev/null; then
  echo "bootstrap: creating $venv (/usr/bin/python3, requirements/dev.lock)"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --require-hashes -r "$repo/requirements/dev.lock"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation --no-index -e "$repo"
  sha256sum "$repo/requirements/dev.lock" | cut -d' ' -f1 >"$stamp"
fi
if ! docker info >/dev/null 2>&1; then
  if [ -d /run/systemd/system ]; then
    systemctl start docker
  else
    echo "bootstrap: starting dockerd (log: /var/log/kooi-ci-dockerd.log)"
    nohup dockerd >/var/log/kooi-ci-dockerd.log 2>&1 &
    echo $! >/run/kooi-ci-dockerd.pid
  fi
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "bootstrap: dockerd did not start" >&2; tail -20 /var/log/kooi-ci-dockerd.log >&2; exit 1; }
fi
echo "bootstrap: ready"
