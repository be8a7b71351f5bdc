#!/bin/sh
# In the cage: the guide's test once per pinned client version (versions), its artifacts
# fetched through the run's egress proxy (the maven_central preset) and checked against
# .mvn/checksums. One line each: "compat java testcontainers VERSION: pass|FAIL". Fails if
# any failed. KOOI_MAVEN_ARGS: more arguments for every build (scripts/lock.sh records).
rc=0
mkdir -p target && rm -f target/kooi-failed
grep -v '^#' versions | while read -r v pg junit; do
  [ -n "$v" ] || continue
  # shellcheck disable=SC2086
  if mvn -B -q -Dtc.version="$v" -Dtc.postgresql="$pg" -Dtc.junit="$junit" ${KOOI_MAVEN_ARGS:-} test; then
    echo "compat java testcontainers $v: pass"
  else
    echo "compat java testcontainers $v: FAIL"; echo fail >> target/kooi-failed
  fi
done
[ ! -e target/kooi-failed ] || rc=1
exit $rc
