#!/usr/bin/env bash
# Build lua-health (main.go: an Argo CD health check run in gopher-lua, the Lua runtime Argo CD
# uses, pinned in tools/lua-health/go.mod) into a cache outside the repository, keyed by version
# (tools/gobuild.sh: the first run on a machine pays for the build, seconds; rebuilt only when
# missing or when its stamp, version + go.sum and main.go hashes, does not match).
#
# Usage: tools/lua-health/build.sh [--print-path]
#   --print-path   print where lua-health is (or will be) and exit
# Environment: METIS_LUA_HEALTH_DIR (default ~/.cache/metis/lua-health/<version>), GO (default go)
# On success the path of lua-health is the only line on stdout; progress goes to stderr.
set -euo pipefail

exec bash "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh" --name lua-health \
  --module github.com/yuin/gopher-lua --package . --hash main.go "$@"
