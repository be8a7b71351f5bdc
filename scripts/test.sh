#!/usr/bin/env bash
# The whole kooi test suite, on a fresh Debian machine as root: lint, unit tests, the
# local end-to-end run (site.yml on this machine, rootless engine, checks, preflight
# refusals) and every Molecule scenario on locally built test hosts.
# Fails loudly when a prerequisite is missing; nothing is skipped.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
KOOI_BOOTSTRAP_TESTS=1 "$repo/scripts/bootstrap.sh"
export PATH="$repo/.venv/bin:$PATH" PYTHONDONTWRITEBYTECODE=1
export KOOI_REPORT_DIR=${KOOI_REPORT_DIR:-$repo/.ci/out}
export KOOI_IMAGE_DIR=${KOOI_IMAGE_DIR:-/var/tmp/kooi-images}
# Written by the images stage (images/runner/prepare-base.sh): the lock with this
# machine's bootstrapped base pinned; site.yml (local and Molecule) builds from it.
export KOOI_RUNNER_IMAGE_LOCK=$KOOI_IMAGE_DIR/runner.lock.yml
mkdir -p "$KOOI_REPORT_DIR"
passed=0; failed=0; failures=()
stage() {
  local name=$1; shift
  echo; echo "=== $name"
  local t0=$SECONDS
  if "$@"; then passed=$((passed + 1)); echo "=== $name: ok ($((SECONDS - t0)) s)"
  else failed=$((failed + 1)); failures+=("$name"); echo "=== $name: FAILED ($((SECONDS - t0)) s)"; fi
}
stage yamllint yamllint -s .
stage ansible-lint bash -c 'cd ansible && ansible-lint --offline -q site.yml ../roles ../molecule'
stage unit pytest -q -p no:cacheprovider tests/unit --junitxml "$KOOI_REPORT_DIR/unit.xml"
stage images bash -c 'molecule/testhost/build-images.sh && images/runner/prepare-base.sh "$KOOI_IMAGE_DIR" \
  && images/vm/build.sh bookworm "$KOOI_IMAGE_DIR/vm"'
stage local-e2e pytest -q -p no:cacheprovider tests/e2e --junitxml "$KOOI_REPORT_DIR/e2e.xml"
for scenario in rootless userns_remap apparmor; do
  stage "molecule-$scenario" env MOLECULE_EPHEMERAL_DIRECTORY="/var/tmp/kooi-molecule-$scenario" \
    molecule test -s "$scenario"
done
echo
[ $failed -eq 0 ] || echo "failed stages: ${failures[*]}"
echo "stages: $passed passed, $failed failed"
[ $failed -eq 0 ]
