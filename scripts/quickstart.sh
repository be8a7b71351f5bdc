#!/usr/bin/env bash
# Quick start: provision THIS machine as a kooi runner host with site.yml (local
# inventory): runner user, rootless engine, the pinned runner image built on it, the
# kooi command and workflows; then run the example workflows through the shim (a Maven
# build in the runner container, the same build's Testcontainers test against a real
# PostgreSQL through a per-run kooi broker, Python tests in a bubblewrap jail) and end with
# `kooi verify`, the check catalogue on this host (exit code 1 if any check fails).
# Run as root on a fresh Debian 12 or 13 machine: scripts/quickstart.sh
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "quickstart: run as root (it provisions this machine)" >&2; exit 2; }
"$repo/scripts/bootstrap.sh"
export PYTHONDONTWRITEBYTECODE=1
export KOOI_IMAGE_DIR=${KOOI_IMAGE_DIR:-/var/tmp/kooi-images}
# The kooi that site.yml installs (Debian's python3 and a root-owned copy of the
# package): what operators, cron and pipelines run. The venv's kooi serves only the
# image preparation below, before site.yml has installed anything.
kooi=/usr/local/bin/kooi
step() { echo; echo "=== quickstart: $* (+$SECONDS s)"; }

step "Debian base of the runner image and the probe image (no registry: debootstrap)"
KOOI_RUNNER_IMAGE_LOCK=$("$repo/images/runner/prepare-base.sh" "$KOOI_IMAGE_DIR" | tail -1)
export KOOI_RUNNER_IMAGE_LOCK
"$repo/molecule/testhost/build-images.sh" --probe-only >/dev/null   # the image the ESC-* checks use

step "ansible-playbook site.yml (this machine, rootless engine)"
(cd "$repo/ansible" && "$repo/.venv/bin/ansible-playbook" -i inventories/local.yml site.yml)
"$kooi" engine start
eval "$(/usr/bin/python3 - <<'PY'
import json; e = json.load(open("/etc/kooi/engine.json"))
print(f"runner={e['runner_user']} sock={e['socket']} uid={e['runner_uid']} home={e['runner_home']}")
PY
)"
runuser -u "$runner" -- env DOCKER_HOST="unix://$sock" XDG_RUNTIME_DIR="/run/user/$uid" \
  docker load -q < "$KOOI_IMAGE_DIR/probe.tar" >/dev/null
# The PostgreSQL image the Testcontainers example uses, built from the local Debian base.
"$repo/images/testcontainers/build.sh" postgres >/dev/null
projects="$home/kooi-examples"
rm -rf "$projects" && mkdir -p "$projects"
cp -r "$repo/examples/maven-example" "$repo/examples/python-example" "$projects/"
chown -R "$runner:$runner" "$projects"

step "kooi run maven-example: Maven + JUnit in the pinned runner image, rootless, offline"
"$kooi" run maven-example --project "$projects/maven-example" --json "$projects/maven-example.json"
step "kooi run maven-testcontainers: Testcontainers + PostgreSQL through the run's kooi broker"
"$kooi" run maven-testcontainers --project "$projects/maven-example" --json "$projects/maven-testcontainers.json"
step "kooi run python-example: unit tests in a bubblewrap jail"
"$kooi" run python-example --project "$projects/python-example" --json "$projects/python-example.json"
echo "--- result of the Maven run ($projects/maven-example.json):"
/usr/bin/python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print({k: r[k] for k in ("workflow","isolation","image_digest","exit_code","reason","duration_s")})' \
  "$projects/maven-example.json"

step "kooi verify: the check catalogue on this machine"
"$kooi" verify
