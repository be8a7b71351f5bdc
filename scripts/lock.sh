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
