#!/usr/bin/env bash
# Install each pinned Testcontainers for Node.js client (locks/tc-VERSION: package-lock.json,
# every package with its integrity hash) into PROJECT_DIR/.deps/VERSION/node_modules, with
# the example's test beside it (Node resolves `testcontainers` from the test's directory),
# so the workload needs no network. Install scripts are not run.
# Usage: vendor.sh PROJECT_DIR
set -euo pipefail
dir=$1
here=$(cd "$(dirname "$0")" && pwd)
command -v npm >/dev/null || { echo "vendor.sh: npm is missing (apt install npm)" >&2; exit 2; }
for lock in "$here"/locks/tc-*/; do
  v=$(basename "$lock"); v=${v#tc-}
  mkdir -p "$dir/.deps/$v"
  cp "$lock/package.json" "$lock/package-lock.json" "$here/../../../examples/testcontainers-node/test/postgres.test.mjs" \
    "$dir/.deps/$v/"
  (cd "$dir/.deps/$v" && npm ci --ignore-scripts --omit=dev --no-audit --no-fund --loglevel=error >/dev/null)
done
echo "$dir/.deps"
