#!/usr/bin/env bash
# Build lua-health (main.go: an Argo CD health check run in gopher-lua, the Lua runtime Argo CD
# uses, pinned in tools/lua-health/go.mod) into a cache outside the repository, keyed by version,
# as tools/promtool/build.sh does for promtool: only the first run on a machine pays for the build
# (seconds). It is rebuilt only when missing or when its stamp (version + go.sum and main.go
# hashes) does not match.
#
# Usage: tools/lua-health/build.sh [--print-path]
#   --print-path   print where lua-health is (or will be) and exit
# Environment: METIS_LUA_HEALTH_DIR (default ~/.cache/metis/lua-health/<version>), GO (default go)
# On success the path of lua-health is the only line on stdout; progress goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="$(awk '$1 == "require" && $2 == "github.com/yuin/gopher-lua" {print $3; exit}' "$here/go.mod")"
[[ -n "$version" ]] || { echo "build.sh: cannot read the gopher-lua version from go.mod" >&2; exit 1; }
out="${METIS_LUA_HEALTH_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/metis/lua-health/$version}"
if [[ "${1:-}" == "--print-path" ]]; then
  echo "$out/lua-health"
  exit 0
fi
stamp="$version $(cat "$here/go.sum" "$here/main.go" | sha256sum | cut -c1-16)"
if [[ -x "$out/lua-health" && "$(cat "$out/.stamp" 2>/dev/null)" == "$stamp" ]]; then
  echo "$out/lua-health"
  exit 0
fi
GO="${GO:-go}"
command -v "$GO" > /dev/null 2>&1 || {
  echo "build.sh: Go is not installed (needed once to build lua-health into $out)" >&2
  exit 1
}
mkdir -p "$out"
exec 9>"$out/.build.lock"
flock 9
echo "build.sh: building lua-health (gopher-lua $version) into $out" >&2
cd "$here"
t0=$SECONDS
GOTOOLCHAIN=local CGO_ENABLED=0 "$GO" build -mod=readonly -trimpath -o "$out/lua-health.new" .
mv "$out/lua-health.new" "$out/lua-health"
echo "$stamp" > "$out/.stamp"
echo "build.sh: built lua-health in $((SECONDS - t0)) s" >&2
echo "$out/lua-health"
