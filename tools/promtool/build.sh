#!/usr/bin/env bash
# Build promtool from the Prometheus Go module pinned in tools/promtool/go.mod into a cache
# outside the repository, keyed by version (tools/gobuild.sh: the first run on a machine pays
# for the build, a few minutes; rebuilt only when missing or when its stamp does not match).
#
# Usage: tools/promtool/build.sh [--print-path]
#   --print-path   print where promtool is (or will be) and exit
# Environment: METIS_PROMTOOL_DIR (default ~/.cache/metis/promtool/<version>), GO (default go)
# On success the path of promtool is the only line on stdout; progress goes to stderr.
set -euo pipefail

# remove_all_sd: Prometheus' own build tag that leaves out every service discovery (the
# cloud SDKs, most of the build): `check rules` and `test rules` need none of them.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh" --name promtool \
  --module github.com/prometheus/prometheus \
  --package github.com/prometheus/prometheus/cmd/promtool \
  --tags remove_all_sd \
  --ldflags "-X github.com/prometheus/common/version.Version={version}" "$@"
