#!/usr/bin/env bash
# `make test`'s suite as two pytest processes side by side: the control-plane tests
# (tests/kube, tests/node: real API servers, the machine's one real node) and all the
# others. The control-plane tests mostly wait on clusters, so beside the rest they cost
# little of the run's time; after it they added 10 to 12 minutes on 2 cores. The project
# holds them to passing under that load (docs/development.md, "Tests"). Their output is printed
# after the rest's; the exit status is the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=(.venv/bin/pytest -m "slow or not slow" --durations=15)
mkdir -p build
log=build/test-control-plane.log
"${PYTEST[@]}" -p no:cacheprovider tests/kube tests/node > "$log" 2>&1 &
plane=$!
trap 'kill "$plane" 2> /dev/null' EXIT INT TERM
"${PYTEST[@]}" --ignore=tests/kube --ignore=tests/node
rest=$?
wait "$plane"
control=$?
trap - EXIT INT TERM
echo "================ the control-plane tests (tests/kube, tests/node; $log) ================"
cat "$log"
if ((rest)); then exit "$rest"; fi
exit "$control"
