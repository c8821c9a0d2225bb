#!/usr/bin/env bash
# Build promtool from the Prometheus Go module pinned in tools/promtool/go.mod into a cache
# outside the repository, keyed by version, as tests/kube/build.sh does for the control plane:
# only the first run on a machine pays for the build (a few minutes). It is rebuilt only when
# missing or when its stamp (version + go.sum hash) does not match.
#
# Usage: tools/promtool/build.sh [--print-path]
#   --print-path   print where promtool is (or will be) and exit
# Environment: METIS_PROMTOOL_DIR (default ~/.cache/metis/promtool/<version>), GO (default go)
# On success the path of promtool is the only line on stdout; progress goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="$(awk '$1 == "require" && $2 == "github.com/prometheus/prometheus" {print $3; exit}' "$here/go.mod")"
[[ -n "$version" ]] || { echo "build.sh: cannot read the prometheus version from go.mod" >&2; exit 1; }
out="${METIS_PROMTOOL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/metis/promtool/$version}"
if [[ "${1:-}" == "--print-path" ]]; then
  echo "$out/promtool"
  exit 0
fi
# remove_all_sd: Prometheus' own build tag that leaves out every service discovery (the
# cloud SDKs, most of the build): `check rules` and `test rules` need none of them.
tags="remove_all_sd"
stamp="$version $tags $(sha256sum "$here/go.sum" | cut -c1-16)"
if [[ -x "$out/promtool" && "$(cat "$out/.stamp" 2>/dev/null)" == "$stamp" ]]; then
  echo "$out/promtool"
  exit 0
fi
GO="${GO:-go}"
command -v "$GO" > /dev/null 2>&1 || {
  echo "build.sh: Go is not installed (needed once to build promtool into $out)" >&2
  exit 1
}
mkdir -p "$out"
exec 9>"$out/.build.lock"
flock 9
echo "build.sh: building promtool $version into $out (minutes, once a machine)" >&2
cd "$here"
t0=$SECONDS
GOTOOLCHAIN=local CGO_ENABLED=0 "$GO" build -mod=readonly -trimpath -tags "$tags" \
  -ldflags "-X github.com/prometheus/common/version.Version=${version#v}" \
  -o "$out/promtool.new" github.com/prometheus/prometheus/cmd/promtool
mv "$out/promtool.new" "$out/promtool"
echo "$stamp" > "$out/.stamp"
echo "build.sh: built promtool in $((SECONDS - t0)) s" >&2
echo "$out/promtool"
