#!/usr/bin/env bash
# Quick start: provision THIS machine as a kooi runner host with site.yml (local
# inventory): runner user, rootless engine, the pinned runner image built on it, the
# kooi command and workflows; then run the example workflows through the shim (a Maven
# build in the runner container, the same build's Testcontainers test against a real
# PostgreSQL through a per-run kooi broker, Python tests in a bubblewrap jail) and end with
# `kooi verify`, the check catalogue on this host (exit code 1 if any check fails).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
"$repo/scripts/bootstrap.sh"
export PATH="$repo/.venv/bin:$PATH" PYTHONDONTWRITEBYTECODE=1
export KOOI_IMAGE_DIR=${KOOI_IMAGE_DIR:-/var/tmp/kooi-images}
# No registry here: bootstrap the runner image's base from Debian packages and pin it.
KOOI_RUNNER_IMAGE_LOCK=$("$repo/images/runner/prepare-base.sh" "$KOOI_IMAGE_DIR" | tail -1)
export KOOI_RUNNER_IMAGE_LOCK
"$repo/molecule/testhost/build-images.sh" >/dev/null   # the probe image the ESC-* checks use
cd "$repo/ansible"
ansible-playbook -i inventories/local.yml site.yml
kooi engine start
eval "$(python3 - <<'PY'
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
echo "--- kooi run maven-example: Maven + JUnit in the pinned runner image, rootless, offline"
kooi run maven-example --project "$projects/maven-example" --json "$projects/maven-example.json"
echo "--- kooi run maven-testcontainers: Testcontainers + PostgreSQL through the run's kooi broker"
kooi run maven-testcontainers --project "$projects/maven-example" --json "$projects/maven-testcontainers.json"
echo "--- kooi run python-example: unit tests in a bubblewrap jail"
kooi run python-example --project "$projects/python-example" --json "$projects/python-example.json"
echo "--- result of the Maven run ($projects/maven-example.json):"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print({k: r[k] for k in ("workflow","isolation","image_digest","exit_code","reason","duration_s")})' \
  "$projects/maven-example.json"
echo "--- kooi verify: the check catalogue on this machine"
/usr/local/bin/kooi verify
