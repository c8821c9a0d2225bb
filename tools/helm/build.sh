#!/usr/bin/env bash
# Build helm from its Go module (helm.sh/helm/v4, pinned in tools/helm/go.mod) into a cache
# outside the repository, keyed by version (tools/gobuild.sh: the first run on a machine pays
# for the build, a few minutes; rebuilt only when missing or when its stamp does not match).
# The chart tests (tests/repository/test_chart.py, tests/kube/test_helm.py) run it.
#
# Usage: tools/helm/build.sh [--print-path]
#   --print-path   print where helm is (or will be) and exit
# Environment: METIS_HELM_DIR (default ~/.cache/metis/helm/<version>), GO (default go)
# On success the path of helm is the only line on stdout; progress goes to stderr.
set -euo pipefail

# The version helm reports (`helm version`, and .Capabilities.HelmVersion in templates), as
# helm's own Makefile sets it.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh" --name helm \
  --module helm.sh/helm/v4 --package helm.sh/helm/v4/cmd/helm \
  --ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=v{version}" "$@"
