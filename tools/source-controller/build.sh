#!/usr/bin/env bash
# Build Flux's source-controller (github.com/fluxcd/source-controller, pinned in
# tools/source-controller/go.mod; its main package is the module root) into a cache outside the
# repository, keyed by version (tools/gobuild.sh: the first run on a machine pays for the build,
# about 6 minutes on 2 cores; rebuilt only when missing or when its stamp does not match), and
# put its CRDs (config/crd/bases of the same module, from the Go module cache) beside it in
# crds/, so that the tests apply the very CRDs of the binary they run, with no copy in the
# repository. tests/support/source_controller.py runs it against the local control plane.
#
# Usage: tools/source-controller/build.sh [--print-path]
#   --print-path   print where source-controller is (or will be) and exit
# Environment: METIS_SOURCE_CONTROLLER_DIR (default ~/.cache/metis/source-controller/<version>),
# GO (default go)
# On success the path of source-controller is the only line on stdout, its CRDs in crds/ beside
# it; progress goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module=github.com/fluxcd/source-controller
# -s -w: no symbol table or DWARF (101 MB instead of 144 MB); the module sets no version
# variable to stamp, and no build tag that leaves out any of its cloud SDKs.
binary="$(bash "$here/../gobuild.sh" --name source-controller --module "$module" \
  --package "$module" --ldflags "-s -w" "$@")"
if [[ " $* " == *" --print-path "* ]]; then
  echo "$binary"
  exit 0
fi

crds="$(dirname "$binary")/crds"
if [[ ! -d "$crds" ]]; then
  cd "$here"
  GO="${GO:-go}"
  # Downloads the module where the binary was cached but the module cache was cleaned since.
  dir="$(GOTOOLCHAIN=local "$GO" mod download -json "$module" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d "$dir/config/crd/bases" ]] || { echo "build.sh: no CRDs in $module ($dir)" >&2; exit 1; }
  # Copied aside, then renamed: a concurrent run sees all of them or none.
  tmp="$(mktemp -d "$crds.XXXXXX")"
  chmod 0755 "$tmp"
  install -m 0644 "$dir"/config/crd/bases/*.yaml "$tmp/"
  mv -T "$tmp" "$crds" 2> /dev/null || rm -rf "$tmp"
fi
echo "$binary"
