#!/usr/bin/env bash
# Build kwok (sigs.k8s.io/kwok/cmd/kwok, pinned in tools/kwok/go.mod) into a cache outside the
# repository, keyed by version (tools/gobuild.sh: the first run on a machine pays for the build,
# a few minutes; rebuilt only when missing or when its stamp does not match).
# bench/operator_kwok.py runs it as a controller against the local control plane: it keeps
# fake Nodes Ready and reports the pods bound to them Running, with no container behind them.
#
# Usage: tools/kwok/build.sh [--print-path]
#   --print-path   print where kwok is (or will be) and exit
# Environment: METIS_KWOK_DIR (default ~/.cache/metis/kwok/<version>), GO (default go)
# On success the path of kwok is the only line on stdout; progress goes to stderr.
set -euo pipefail

# The version kwok reports (`kwok --version`), as kwok's own hack/releases.sh sets it.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh" --name kwok \
  --module sigs.k8s.io/kwok --package sigs.k8s.io/kwok/cmd/kwok \
  --ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=v{version}" "$@"
