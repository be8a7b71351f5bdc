#!/usr/bin/env bash
# The whole kooi test suite, on a fresh Debian machine as root: lint, unit tests, the
# local end-to-end run (site.yml on this machine, rootless engine, checks, preflight
# refusals) and every Molecule scenario on locally built test hosts.
# Fails loudly when a prerequisite is missing; nothing is skipped.
#
# Four lanes run side by side. The suite is CPU-bound on two cores (a clean run kept
# them 94% busy), so the lanes do not make the work cheaper; they keep both cores busy
# while one stage waits (test hosts booting, engines starting, timeouts, downloads) and
# let the longest chains start early:
#   lane 1 (streamed): yamllint, ansible-lint, role-docs, ruff, mypy, unit, images, local-e2e
#   lane 2 (logged):   images-vm, molecule-apparmor (a QEMU guest under TCG), then (after
#                      lane 1's images) molecule-nosystemd
#   lane 3 (logged):   (after lane 1's images) molecule-rootless
#   lane 4 (logged):   (after lane 1's images) molecule-userns_remap
# Every stage's output is in $KOOI_REPORT_DIR/logs/STAGE.log; lanes 2 to 4 print a
# stage's log when it ends. Each stage has a time limit (KOOI_STAGE_TIMEOUT_<STAGE>, seconds;
# default 2700, Molecule scenarios 3600) so
# a hang fails that stage with its log instead of stalling the run.
# KOOI_TEST_SERIAL=1 runs every stage in one lane (lane 1, then lanes 3, 4 and 2).
# --quick: the developers' inner loop, lane 1 alone without the test-host images (lint,
# unit, this machine's end-to-end tests), no Molecule scenario; docs/testing.md.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac
export quick
KOOI_BOOTSTRAP_TESTS=$([ "$quick" = 1 ] && echo quick || echo 1) "$repo/scripts/bootstrap.sh"
export PATH="$repo/.venv/bin:$PATH" PYTHONDONTWRITEBYTECODE=1
export KOOI_REPORT_DIR=${KOOI_REPORT_DIR:-$repo/.ci/out}
export KOOI_IMAGE_DIR=${KOOI_IMAGE_DIR:-/var/tmp/kooi-images}
# Written by the images stage (images/runner/prepare-base.sh): the lock with this
# machine's bootstrapped base pinned; site.yml (local and Molecule) builds from it.
export KOOI_RUNNER_IMAGE_LOCK=$KOOI_IMAGE_DIR/runner.lock.yml
# Where the time goes, in every playbook run (the slowest tasks at the end of each).
export ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks PROFILE_TASKS_TASK_OUTPUT_LIMIT=15
logs=$KOOI_REPORT_DIR/logs
mkdir -p "$logs"
rm -f "$logs"/*.status "$logs"/*.log
start=$SECONDS
# Free disk (MiB, on the file systems the engines and test hosts write to) every 10 s:
# a full disk fails image loads in three test hosts at once, and only this says so.
disk_free() { df -m --output=avail / /var/lib/docker /var/tmp 2>/dev/null | awk 'NR > 1 && (m == "" || $1 < m) {m = $1} END {print m}'; }
echo "=== free disk at the start: $(disk_free) MiB"
( while :; do echo "$((SECONDS - start)) $(disk_free)"; sleep 10; done ) >"$logs/disk.samples" 2>/dev/null &
disk_sampler=$!
trap 'kill "$disk_sampler" 2>/dev/null || true' EXIT

# stage NAME CMD...: run CMD with a time limit, its output in $logs/NAME.log (also on
# stdout when STREAM=1, else printed whole when it ends); "rc seconds" in NAME.status.
stage() {
  local name=$1; shift
  local var="KOOI_STAGE_TIMEOUT_${name//-/_}"; var=${var^^}
  local limit=${!var:-${STAGE_LIMIT:-2700}} t0=$SECONDS rc
  if [ "${STREAM:-1}" = 1 ]; then
    echo; echo "=== $name (started at +$((SECONDS - start)) s)"
    set +e; timeout -k 60 "$limit" "$@" 2>&1 | tee "$logs/$name.log"; rc=${PIPESTATUS[0]}; set -e
  else
    set +e; timeout -k 60 "$limit" "$@" >"$logs/$name.log" 2>&1; rc=$?; set -e
  fi
  [ "$rc" != 124 ] && [ "$rc" != 137 ] || echo "=== $name: timed out after $limit s" >>"$logs/$name.log"
  # ON_FAIL: a command whose output (what the failed stage left running) joins the log.
  [ "$rc" = 0 ] || [ -z "${ON_FAIL:-}" ] || $ON_FAIL >>"$logs/$name.log" 2>&1 || true
  echo "$rc $((SECONDS - t0))" >"$logs/$name.status"
  {
    flock 9
    if [ "${STREAM:-1}" != 1 ]; then
      echo; echo "=== $name (logged, started at +$((t0 - start)) s)"; cat "$logs/$name.log"
    fi
    [ "$rc" = 0 ] && echo "=== $name: ok ($((SECONDS - t0)) s)" || echo "=== $name: FAILED, rc $rc ($((SECONDS - t0)) s)"
  } 9>"$logs/.print.lock"
  return 0
}
ok() { [ -f "$logs/$1.status" ] && [ "$(cut -d' ' -f1 "$logs/$1.status")" = 0 ]; }
# wait_for STAGE: block until lane 1 has finished STAGE; false when it failed.
wait_for() { while [ ! -f "$logs/$1.status" ]; do sleep 5; done; ok "$1"; }
skipped() { echo "1 0" >"$logs/$1.status"; echo "=== $1: FAILED, not run: $2"; }

# What the test hosts of a failed (typically timed-out: molecule had no chance to
# destroy them) scenario were doing: pending systemd jobs, processes, the journal.
molecule_diagnostics() {
  local c
  for c in $(docker ps --format '{{.Names}}' --filter "name=^kooi-$1-"); do
    echo; echo "=== diagnostics of $c"
    timeout 60 docker exec "$c" sh -c 'systemctl list-jobs --no-pager; systemctl --failed --no-pager;
      ps -eo pid,user,etime,stat,args --forest | head -80; journalctl --no-pager -n 200 -o short-monotonic'
  done
  echo; echo "=== free disk now: $(disk_free) MiB"; df -h / /var/lib/docker /var/tmp
}
molecule_stage() {
  # 3600 s: with three lanes on two cores a full rootless scenario took 2420 s once.
  STAGE_LIMIT=3600 ON_FAIL="molecule_diagnostics $1" stage "molecule-$1" env MOLECULE_EPHEMERAL_DIRECTORY="/var/tmp/kooi-molecule-$1" molecule test -s "$1"
}
lane2() {
  stage images-vm images/vm/build.sh bookworm "$KOOI_IMAGE_DIR/vm"
  if ok images-vm; then molecule_stage apparmor; else skipped molecule-apparmor "images-vm failed"; fi
  # Then the host without systemd (mode switches by direct management): it ended the
  # critical path after local-e2e (1745 + 790 s); here it starts when the AppArmor guest
  # ends (about 1400 s) and runs beside local-e2e's last part and the other scenarios.
  if wait_for images; then molecule_stage nosystemd; else skipped molecule-nosystemd "images failed"; fi
}
lane3() {
  if wait_for images; then molecule_stage rootless; else skipped molecule-rootless "images failed"; fi
}
lane4() {
  if wait_for images; then molecule_stage userns_remap; else skipped molecule-userns_remap "images failed"; fi
}

# The images every later stage needs: the runner image's pinned base and the probe image
# (this machine's tests), the test hosts, and the runner image itself, built once here
# (site.yml on this machine, which the quick start has usually done already) and saved
# for the test hosts to load (kooi_runner_image_prebuilt) instead of building it again.
images() {
  set -euo pipefail
  images/runner/prepare-base.sh "$KOOI_IMAGE_DIR"
  if [ "$quick" = 1 ]; then molecule/testhost/build-images.sh --probe-only; return; fi
  molecule/testhost/build-images.sh
  local tags=()
  # A provisioned machine needs only the image role (a second full run is local-e2e's).
  [ -r /etc/kooi/engine.json ] && tags=(--tags runner_image)
  (cd ansible && ansible-playbook -i inventories/local.yml site.yml "${tags[@]}")
  local id
  id=$(python3 -c 'import json; print(json.load(open("/etc/kooi/images.json"))["runner"]["id"])')
  if [ "$(cat "$KOOI_IMAGE_DIR/runner-image.tar.id" 2>/dev/null)" != "$id" ]; then
    /usr/local/bin/kooi image save --name runner --out "$KOOI_IMAGE_DIR/runner-image.tar"
    echo "$id" >"$KOOI_IMAGE_DIR/runner-image.tar.id"
  fi
  chmod 0644 "$KOOI_IMAGE_DIR/runner-image.tar"
}

lanes=()
if [ "${KOOI_TEST_SERIAL:-0}" != 1 ] && [ "$quick" = 0 ]; then
  STREAM=0 lane2 & lanes+=($!)
  STREAM=0 lane3 & lanes+=($!)
  STREAM=0 lane4 & lanes+=($!)
fi
stage yamllint yamllint -s .
stage ansible-lint bash -c 'cd ansible && ansible-lint --offline -q site.yml ../roles ../molecule'
stage role-docs python scripts/role-docs.py --check
stage ruff ruff check .
stage mypy bash -c "mypy && mypy --config-file molecule/mypy.ini molecule/"
stage unit pytest -q -p no:cacheprovider tests/unit --junitxml "$KOOI_REPORT_DIR/unit.xml"
export -f images
stage images bash -c images
if ok images; then
  # The hostile suite (molecule/shared/test_hostile*.py) against this machine's rootless
  # engine; Molecule's verify runs it on the userns-remap host.
  # 3600 s like the scenarios: on a slow day of this machine kind the whole run took
  # about twice its usual time (local-e2e over 2700 s, rootless 3226 s).
  STAGE_LIMIT=3600 stage local-e2e pytest -q -p no:cacheprovider --durations=15 tests/e2e molecule/shared/test_hostile.py \
    molecule/shared/test_hostile_root.py molecule/shared/test_hostile_git.py --hosts=local:// --junitxml "$KOOI_REPORT_DIR/e2e.xml"
else
  skipped local-e2e "images failed"
fi
stages=(yamllint ansible-lint role-docs ruff mypy unit images local-e2e)
if [ "$quick" = 0 ]; then
  if [ ${#lanes[@]} -gt 0 ]; then wait "${lanes[@]}" || true; else lane3; lane4; lane2; fi
  stages+=(molecule-nosystemd molecule-rootless images-vm molecule-apparmor molecule-userns_remap)
fi

# Why each failed stage failed, right above the summary: CI shows only the tail of this
# output, and a lane's log printed half an hour earlier is out of sight there.
for s in "${stages[@]}"; do
  ok "$s" || [ ! -s "$logs/$s.log" ] || {
    echo; echo "=== why $s failed (excerpt; the whole log: $logs/$s.log)"
    # pytest's short summary and assertion lines, Ansible's failed tasks and their
    # messages, Molecule's failed step, the stage's own time-out line.
    # Molecule frames a step's output with colour codes and "│ ", which go first.
    sed -E 's/\x1b\[[0-9;]*m//g; s/^ *│ ?//; /FAILED - RETRYING/d; /glob failed/d' "$logs/$s.log" |
      grep -a -E -A4 '^ *(FAILED|ERROR) |^ *E  |fatal: \[|failed: \[|FAILED!|CRITICAL|Executed: Failed|timed out after|^ *(msg|stderr): ' |
      cut -c1-400 | tail -n 80
  }
done
echo; echo "=== summary (wall $((SECONDS - start)) s; free disk: $(disk_free) MiB now, at least" \
  "$(awk 'NR == 1 || $2 < m {m = $2; t = $1} END {print m " MiB (at +" t " s)"}' "$logs/disk.samples"))"
failed=()
for s in "${stages[@]}"; do
  read -r rc secs <"$logs/$s.status" 2>/dev/null || { rc=missing; secs=0; }
  printf '%-24s %-8s %5s s\n' "$s" "$([ "$rc" = 0 ] && echo ok || echo "FAILED")" "$secs"
  [ "$rc" = 0 ] || failed+=("$s")
done
[ ${#failed[@]} -eq 0 ] || { echo "failed stages: ${failed[*]}"; exit 1; }
echo "all stages passed"
