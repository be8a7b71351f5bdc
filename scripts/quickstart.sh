#!/usr/bin/env bash
# Quick start: provision THIS machine as a kooi runner host with site.yml (local
# inventory), start the runner's rootless engine, and show a container started by the
# runner user whose root is an unprivileged host uid.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
"$repo/scripts/bootstrap.sh"
export PATH="$repo/.venv/bin:$PATH" PYTHONDONTWRITEBYTECODE=1
cd "$repo/ansible"
ansible-playbook -i inventories/local.yml site.yml
kooi engine start
eval "$(python3 - <<'PY'
import json; e = json.load(open("/etc/kooi/engine.json"))
print(f"runner={e['runner_user']} sock={e['socket']} uid={e['runner_uid']}")
PY
)"
as_runner() { runuser -u "$runner" -- env DOCKER_HOST="unix://$sock" XDG_RUNTIME_DIR="/run/user/$uid" "$@"; }
"$repo/molecule/testhost/build-images.sh" >/dev/null
as_runner docker load -q < "${KOOI_IMAGE_DIR:-/var/tmp/kooi-images}/probe.tar"
echo "--- a container started by $runner on the rootless engine:"
as_runner docker run --rm --network none kooi-probe:latest sh -c \
  'echo "id in container: $(id -u)"; echo "uid_map (container host count):"; cat /proc/self/uid_map'
echo "--- kooi's host checks on this machine:"
python -m pytest --pyargs kooi.checks --hosts=local:// -q -p no:cacheprovider -rA | grep -E '^(HOST|ESC)-|passed|failed'
