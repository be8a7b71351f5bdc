#!/usr/bin/env bash
# Hosts without a registry: bootstrap the runner image's base from Debian packages
# (images/base/build.sh), save it as the archive the lock names, and pin its image id
# in a copy of the lock. Prints the path of that lock copy on the last line.
#   prepare-base.sh [OUT_DIR]   (default $KOOI_IMAGE_DIR or /var/tmp/kooi-images)
# The base is reused while the image exists (KOOI_REBUILD=1 bootstraps a new one, which
# gets a new id: a new pin). Needs root, debootstrap and a Docker daemon.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-${KOOI_IMAGE_DIR:-/var/tmp/kooi-images}}
lock="$here/lock.yml"
py=${KOOI_PYTHON:-$repo/.venv/bin/python}
read -r ref suite archive < <("$py" -c 'import sys,yaml; b=yaml.safe_load(open(sys.argv[1]))["base"]; print(b["ref"], b["suite"], b["archive"])' "$lock")
mkdir -p "$out"
if [ "${KOOI_REBUILD:-0}" = 1 ] || ! docker image inspect "$ref" >/dev/null 2>&1; then
  echo "prepare-base: bootstrapping $ref from Debian $suite" >&2
  "$repo/images/base/build.sh" "$suite" "$ref" >/dev/null
fi
id=$(docker image inspect --format '{{.Id}}' "$ref")
if [ ! -s "$out/$archive" ] || [ "$(cat "$out/$archive.id" 2>/dev/null)" != "$id" ]; then
  docker save "$ref" -o "$out/$archive.tmp"
  mv "$out/$archive.tmp" "$out/$archive"
  echo "$id" >"$out/$archive.id"
fi
chmod 0644 "$out/$archive" "$out/$archive.id"
"$repo/.venv/bin/kooi" image lock --lock "$lock" --pin-base "$ref" --out "$out/runner.lock.yml" >&2
chmod 0644 "$out/runner.lock.yml"
echo "$out/runner.lock.yml"
