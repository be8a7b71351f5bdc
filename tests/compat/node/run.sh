#!/bin/sh
# In the cage: the Node.js example's test once per vendored client version (.deps/VERSION,
# vendor.sh), or per VERSION given (12.x needs Node 22: the runner image's node22 variant).
# One line each: "compat node testcontainers VERSION (node NODE): pass|FAIL". Fails if
# any failed.
rc=0
if [ $# -eq 0 ]; then set -- $(ls .deps); fi
for v in "$@"; do
  if node --test ".deps/$v/"*.test.mjs; then
    echo "compat node testcontainers $v (node $(node --version)): pass"
  else
    echo "compat node testcontainers $v (node $(node --version)): FAIL"; rc=1
  fi
done
exit $rc
