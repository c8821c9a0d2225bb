#!/usr/bin/env bash
# Build versitygw (github.com/versity/versitygw, Apache-2.0, pinned in tools/s3-server/go.mod;
# its main package is cmd/versitygw), an S3-compatible server that checks AWS SigV4 signatures
# and keeps objects as files (its posix backend), into a cache outside the repository, keyed by
# version (tools/gobuild.sh: the first run on a machine pays for the build, about 2 minutes on
# 2 cores; rebuilt only when missing or when its stamp does not match). The binary is named
# s3-server after this folder. tests/support/s3_server.py runs it on loopback as the S3 endpoint
# of Flux Buckets.
#
# Usage: tools/s3-server/build.sh [--print-path]
#   --print-path   print where s3-server is (or will be) and exit
# Environment: METIS_S3_SERVER_DIR (default ~/.cache/metis/s3-server/<version>), GO (default go)
# On success the path of s3-server is the only line on stdout; progress goes to stderr.
set -euo pipefail

# -s -w: no symbol table or DWARF; main.Version is what `s3-server --version` prints.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh" --name s3-server \
  --module github.com/versity/versitygw \
  --package github.com/versity/versitygw/cmd/versitygw \
  --ldflags "-s -w -X main.Version=v{version}" "$@"
