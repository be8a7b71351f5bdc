#!/usr/bin/env bash
# Install each pinned client's lock (locks/tc-VERSION.txt, hashed: scripts/lock.sh) into
# PROJECT/.deps/VERSION for the runner image's Python (3.13, manylinux wheels up to glibc 2.28; trixie has 2.41): the
# workload runs offline. Run on the host (nothing is executed).
# Usage: vendor.sh PROJECT_DIR
set -euo pipefail
dir=$1
here=$(cd "$(dirname "$0")" && pwd)
pip=$(command -v pip3 || command -v pip || true)
[ -n "$pip" ] || { echo "vendor.sh: pip is missing (apt install python3-pip)" >&2; exit 2; }
rm -rf "$dir/.deps"
for lock in "$here"/locks/tc-*.txt; do
  v=$(basename "$lock" .txt); v=${v#tc-}
  "$pip" install -q --disable-pip-version-check --no-compile --target "$dir/.deps/$v" \
    --python-version 3.13 --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --only-binary=:all: \
    --require-hashes -r "$lock"
done
