#!/usr/bin/env bash
# Refresh kooi's Python locks (exact versions and sha256 hashes of every package):
#   requirements/dev.lock                           the control node and the test suite
#                                                   (pyproject.toml's dependencies + `dev`
#                                                   extra + requirements/build.in), for
#                                                   every Python from 3.11 (Debian 12 and 13)
#   examples/testcontainers-python/requirements.txt the example's vendored dependencies
#                                                   (the runner image's Python 3.13)
#   tests/compat/python/locks/tc-VERSION.txt        each pinned testcontainers-python
#                                                   client of the compatibility matrix
#   tests/compat/node/locks/tc-VERSION/             each pinned Testcontainers for Node.js
#                                                   client (npm's package-lock.json)
#   tests/compat/java/.mvn/checksums                Maven's trusted checksums of each pinned
#                                                   Testcontainers for Java client's build
#                                                   (KOOI_LOCK_JAVA=1, root on a provisioned host)
# scripts/bootstrap.sh and vendor.sh install only from these (pip --require-hashes).
# Usage: scripts/lock.sh [--upgrade-package NAME]...   (default: keep what the lock has
# where the inputs still allow it; --upgrade takes the newest of everything)
# Needs network access to PyPI; review the diff and commit it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
uv_version=0.13.8
tools=${KOOI_LOCK_TOOLS:-/var/tmp/kooi-lock-tools}
if [ ! -x "$tools/bin/uv" ] || [ "$("$tools/bin/uv" --version | cut -d' ' -f2)" != "$uv_version" ]; then
  rm -rf "$tools"
  /usr/bin/python3 -m venv "$tools"
  "$tools/bin/pip" install -q "uv==$uv_version"
fi
uv=$tools/bin/uv
cd "$repo"
"$uv" pip compile pyproject.toml requirements/build.in --extra dev --universal --python-version 3.11 \
  --generate-hashes --no-strip-extras --custom-compile-command scripts/lock.sh \
  -o requirements/dev.lock "$@"
"$uv" pip compile examples/testcontainers-python/requirements.in --python-version 3.13 \
  --python-platform x86_64-manylinux_2_17 --generate-hashes --custom-compile-command scripts/lock.sh \
  -o examples/testcontainers-python/requirements.txt "$@"
# The Testcontainers compatibility matrix: one lock per pinned client version (issue 31).
for in_file in tests/compat/python/locks/tc-*.in; do
  "$uv" pip compile "$in_file" --python-version 3.13 --python-platform x86_64-manylinux_2_17 --generate-hashes \
    --custom-compile-command scripts/lock.sh -o "${in_file%.in}.txt" "$@"
done
echo "lock.sh: requirements/dev.lock, examples/testcontainers-python/requirements.txt and tests/compat/python/locks refreshed"
# Testcontainers for Node.js: one package-lock.json per pinned client (integrity hashes).
if command -v npm >/dev/null; then
  for lock_dir in tests/compat/node/locks/tc-*/; do
    (cd "$lock_dir" && npm install --package-lock-only --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
  done
  echo "lock.sh: tests/compat/node/locks refreshed"
else
  echo "lock.sh: npm missing, tests/compat/node/locks not refreshed" >&2
fi
# Testcontainers for Java: Maven's trusted checksums of every artifact each pinned client's
# build resolves, recorded by the runner image's Maven (3.9) in a kooi run through the
# egress proxy: only as root on a host site.yml provisioned (KOOI_LOCK_JAVA=1).
if [ "${KOOI_LOCK_JAVA:-}" = 1 ]; then
  runner=$(python3 -c 'import json; print(json.load(open("/etc/kooi/engine.json"))["runner_user"])')
  home=$(getent passwd "$runner" | cut -d: -f6)
  wf=$(mktemp -d) && chmod 755 "$wf"
  proj="$home/kooi-lock-java-$$"
  trap 'rm -rf "$wf"; runuser -u "$runner" -- rm -rf "$proj"' EXIT
  printf '%s\n' "description: record the Java compatibility project's trusted checksums" "mode: container" \
    "image: runner" "testcontainers: true" "command: [sh, run.sh]" "timeout: 1800" "environment:" \
    "  KOOI_MAVEN_ARGS: -Daether.artifactResolver.postProcessor.trustedChecksums.record=true" > "$wf/lock-java.yml"
  cp -r tests/compat/java "$proj" && rm -rf "$proj/.mvn/checksums" "$proj/target" && chown -R "$runner:" "$proj"
  KOOI_WORKFLOW_DIR=$wf kooi run lock-java --project "$proj"
  mkdir -p tests/compat/java/.mvn/checksums
  cp "$proj"/.mvn/checksums/checksums-*.sha256 tests/compat/java/.mvn/checksums/
  echo "lock.sh: tests/compat/java/.mvn/checksums recorded"
fi
