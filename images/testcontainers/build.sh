#!/usr/bin/env bash
# Build the images Testcontainers tests use on the runner's rootless engine, from the
# locally bootstrapped Debian base that site.yml loaded there (no registry needed).
# Usage (as root, after site.yml): images/testcontainers/build.sh [--tag EXTRA]... [NAME...]
#   default: postgres  ->  kooi-postgres:17
#   --tag EXTRA: one more name for the image (tests give PostgreSQL the guides' name,
#   postgres:16-alpine, where no registry serves it; never on a host that pulls it)
set -euo pipefail
extra=()
while [ "${1:-}" = --tag ]; do
  [ -n "${2:-}" ] || { echo "build.sh: --tag needs a name" >&2; exit 2; }
  extra+=(-t "$2"); shift 2
done
here=$(cd "$(dirname "$0")" && pwd)
engine=/etc/kooi/engine.json
[ -r "$engine" ] || { echo "build.sh: $engine is missing; provision the host with site.yml first" >&2; exit 2; }
read -r runner socket token_file < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]));
print(d["runner_user"], d["socket"], (d.get("authz") or {}).get("token_file") or "-")' "$engine")
if [ "$token_file" != - ] && [ -r "$token_file" ]; then
  # A daemon behind kooi's authorization plugin builds only for the operator (root,
  # with the root-only token, as site.yml's runner image build does).
  cfgdir=$(mktemp -d)
  trap 'rm -rf "$cfgdir"' EXIT
  python3 -c 'import json,sys; print(json.dumps({"HttpHeaders": {"X-Kooi-Token": open(sys.argv[1]).read().strip()}}))' \
    "$token_file" >"$cfgdir/config.json"
  as_runner() { env DOCKER_HOST="unix://$socket" DOCKER_CONFIG="$cfgdir" "$@"; }
else
  as_runner() { runuser -u "$runner" -- env DOCKER_HOST="unix://$socket" "$@"; }
fi
as_runner docker image inspect kooi-base:trixie >/dev/null 2>&1 \
  || { echo "build.sh: the runner's engine has no kooi-base:trixie; run site.yml (role runner_image)" >&2; exit 2; }
# Where egress control is on, the build's downloads go through kooi's proxy (the only
# way out for the runner's engine): Docker's predefined proxy build arguments.
proxy_args=()
if [ -r /etc/kooi/egress.json ]; then
  url=$(/usr/local/bin/kooi egress proxy-url) \
    || { echo "build.sh: cannot tell where the engine's containers reach the egress proxy" >&2; exit 2; }
  for v in http_proxy https_proxy HTTP_PROXY HTTPS_PROXY; do proxy_args+=(--build-arg "$v=$url"); done
fi
for name in "${@:-postgres}"; do
  case $name in
    postgres) tag=kooi-postgres:17 ;;
    *) echo "build.sh: unknown image $name (known: postgres)" >&2; exit 2 ;;
  esac
  # The context goes over stdin: the runner need not read the checkout.
  tar -C "$here/$name" -c . | as_runner docker build -q "${proxy_args[@]}" -f Containerfile -t "$tag" "${extra[@]}" - \
    >/dev/null
  echo "$tag"
done
