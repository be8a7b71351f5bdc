#!/bin/sh
# In the cage: the Node.js example's test once per vendored client version (.deps/VERSION,
# vendor.sh). One line each: "compat node testcontainers VERSION: pass|FAIL". Fails if
# any failed.
rc=0
for deps in .deps/*/; do
  v=$(basename "$deps")
  if node --test "$deps"; then
    echo "compat node testcontainers $v: pass"
  else
    echo "compat node testcontainers $v: FAIL"; rc=1
  fi
done
exit $rc
