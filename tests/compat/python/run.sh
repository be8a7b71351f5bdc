#!/bin/sh
# In the cage: the store's test once per vendored client version (.deps/VERSION), and the
# getting-started guide's fixture for 4.4.0, the version the guide pins. One line each:
# "compat python testcontainers VERSION (TESTS): pass|FAIL". Fails if any failed.
rc=0
for deps in .deps/*/; do
  v=$(basename "$deps")
  tests=tests/test_store.py
  [ "$v" = 4.4.0 ] && tests="$tests tests/test_guide.py"
  # shellcheck disable=SC2086
  if PYTHONPATH="$PWD/$deps" python3 -B -m pytest -q -p no:cacheprovider $tests; then
    echo "compat python testcontainers $v ($tests): pass"
  else
    echo "compat python testcontainers $v ($tests): FAIL"; rc=1
  fi
done
exit $rc
