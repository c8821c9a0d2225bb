#!/usr/bin/env bash
# Build one Go tool from the wrapper module in its folder (tools/<name>/go.mod, which pins it)
# into a cache outside the repository, keyed by version, as metis_dev/build.sh does for the
# control plane: only the first run on a machine pays for the build. It is rebuilt only when
# missing or when its stamp (version, tags, and the hash of go.sum and any --hash files) does
# not match. Concurrent runs (the tests beside each other) wait on one lock instead of building
# twice. Each tool's build.sh is a few lines calling this script (promtool, lua-health, helm,
# kubeconform), so the caching, the stamp and the lock live in one place.
#
# Usage: tools/gobuild.sh --name NAME --module MODULE --package PKG [--tags TAGS]
#                         [--ldflags FLAGS] [--hash FILE]... [--print-path]
#   --name NAME      the binary's name; the wrapper module is tools/NAME
#   --module MODULE  the pinned module whose version (read from tools/NAME/go.mod) keys the cache
#   --package PKG    the main package to build (`.` for a main package in tools/NAME itself)
#   --tags TAGS      Go build tags (part of the stamp)
#   --ldflags FLAGS  linker flags; `{version}` is replaced by the version without its `v`
#   --hash FILE      a file of tools/NAME besides go.sum whose change means a rebuild
#   --print-path     print where the binary is (or will be) and exit, building nothing
# Environment: METIS_<NAME>_DIR (NAME upper-cased, `-` as `_`; default
# ~/.cache/metis/NAME/<version>), GO (default go).
# On success the binary's path is the only line on stdout; progress goes to stderr.
set -euo pipefail
# shellcheck source=progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/progress.sh"

die() { echo "gobuild.sh: $*" >&2; exit 1; }

name="" module="" package="" tags="" ldflags="" print_path=0
hashed=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) name="$2"; shift 2 ;;
    --module) module="$2"; shift 2 ;;
    --package) package="$2"; shift 2 ;;
    --tags) tags="$2"; shift 2 ;;
    --ldflags) ldflags="$2"; shift 2 ;;
    --hash) hashed+=("$2"); shift 2 ;;
    --print-path) print_path=1; shift ;;
    *) die "unknown argument: $1" ;;
  esac
done
[[ -n "$name" && -n "$module" && -n "$package" ]] || die "--name, --module and --package are required"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/$name" && pwd)"
version="$(awk -v m="$module" '$1 == "require" && $2 == m {print $3; exit} $1 == m {print $2; exit}' "$here/go.mod")"
[[ -n "$version" ]] || die "cannot read the version of $module from tools/$name/go.mod"
var="METIS_$(echo "$name" | tr 'a-z-' 'A-Z_')_DIR"
out="${!var:-${XDG_CACHE_HOME:-$HOME/.cache}/metis/$name/$version}"
if [[ "$print_path" == 1 ]]; then
  echo "$out/$name"
  exit 0
fi
stamp="$version${tags:+ $tags} $(cd "$here" && cat go.sum "${hashed[@]}" | sha256sum | cut -c1-16)"
fresh() { [[ -x "$out/$name" && "$(cat "$out/.stamp" 2>/dev/null)" == "$stamp" ]]; }
if fresh; then
  echo "$out/$name"
  exit 0
fi
GO="${GO:-go}"
command -v "$GO" > /dev/null 2>&1 || die "Go is not installed (needed once to build $name into $out)"
mkdir -p "$out"
exec 9>"$out/.build.lock"
take_lock 9 "$out/.build.lock" "$name $version in $out"
# Another run may have built it while this one waited for the lock.
if fresh; then
  echo "$out/$name"
  exit 0
fi
echo "gobuild.sh: building $name ($module $version) into $out (once a machine)" >&2
cd "$here"
t0=$SECONDS
GOTOOLCHAIN=local CGO_ENABLED=0 with_heartbeat "building $name" "$GO" build -mod=readonly \
  -trimpath -tags "$tags" -ldflags "${ldflags//\{version\}/${version#v}}" -o "$out/$name.new" \
  "$package"
mv "$out/$name.new" "$out/$name"
echo "$stamp" > "$out/.stamp"
echo "gobuild.sh: built $name in $((SECONDS - t0)) s: $out/$name" >&2
echo "$out/$name"
