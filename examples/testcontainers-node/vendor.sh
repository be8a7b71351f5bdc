#!/usr/bin/env bash
# Install the example's Node.js dependencies (package-lock.json: every package pinned
# with its integrity hash) into node_modules/ of PROJECT_DIR, so the workload needs no
# network. Install scripts are not run (nothing is executed on the host; the packages
# are plain JavaScript, ssh2's optional native speed-up is left out).
# Usage: vendor.sh [PROJECT_DIR]   (default: this directory)
set -euo pipefail
dir=${1:-$(cd "$(dirname "$0")" && pwd)}
here=$(cd "$(dirname "$0")" && pwd)
command -v npm >/dev/null || { echo "vendor.sh: npm is missing (apt install npm)" >&2; exit 2; }
if [ "$dir" != "$here" ]; then cp "$here/package.json" "$here/package-lock.json" "$dir/"; fi
(cd "$dir" && npm ci --ignore-scripts --omit=dev --no-audit --no-fund --loglevel=error >/dev/null)
echo "$dir/node_modules"
