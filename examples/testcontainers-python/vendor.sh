#!/usr/bin/env bash
# Install the example's Python dependencies (requirements.txt: every package pinned and
# hashed by scripts/lock.sh) into .deps/ for the runner image's Python
# (3.13, manylinux wheels), so the workload needs no network: the workflow puts .deps
# on PYTHONPATH. Run on the host (pip from the host is fine; nothing is executed).
# Usage: vendor.sh [PROJECT_DIR]   (default: this directory)
set -euo pipefail
dir=${1:-$(cd "$(dirname "$0")" && pwd)}
here=$(cd "$(dirname "$0")" && pwd)
pip=$(command -v pip3 || command -v pip || true)
[ -n "$pip" ] || { echo "vendor.sh: pip is missing (apt install python3-pip)" >&2; exit 2; }
rm -rf "$dir/.deps"
"$pip" install -q --disable-pip-version-check --no-compile --target "$dir/.deps" \
  --python-version 3.13 --implementation cp --platform manylinux2014_x86_64 --only-binary=:all: \
  --require-hashes -r "$here/requirements.txt"
echo "$dir/.deps"
