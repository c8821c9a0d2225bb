#!/usr/bin/env bash
# Build kubeconform from its Go module (github.com/yannh/kubeconform, pinned in
# tools/kubeconform/go.mod) into a cache outside the repository, keyed by version
# (tools/gobuild.sh: the first run on a machine pays for the build, seconds; rebuilt only when
# missing or when its stamp does not match). The chart tests validate the rendered chart with
# it, offline: they give it the schemas (tests/repository/test_chart.py, tests/kube/test_helm.py).
#
# Usage: tools/kubeconform/build.sh [--print-path]
#   --print-path   print where kubeconform is (or will be) and exit
# Environment: METIS_KUBECONFORM_DIR (default ~/.cache/metis/kubeconform/<version>), GO (default go)
# On success the path of kubeconform is the only line on stdout; progress goes to stderr.
set -euo pipefail

exec bash "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh" --name kubeconform \
  --module github.com/yannh/kubeconform --package github.com/yannh/kubeconform/cmd/kubeconform \
  --ldflags "-X main.version=v{version}" "$@"
