//go:build tools

// Package tools pins versitygw (github.com/versity/versitygw, Apache-2.0, main package
// cmd/versitygw), an S3-compatible gateway that checks AWS SigV4 signatures and, with its posix
// backend, keeps buckets as folders and objects as files: tools/s3-server/build.sh builds it from
// this module into ~/.cache/metis/s3-server/<version>; tests/support/s3_server.py runs it on
// loopback for the tests of Flux Buckets.
package tools

import _ "github.com/versity/versitygw/cmd/versitygw"
