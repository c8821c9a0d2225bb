//go:build tools

// Package tools pins Flux's source-controller (github.com/fluxcd/source-controller, whose main
// package is the module root): tools/source-controller/build.sh builds it from this module into
// ~/.cache/metis/source-controller/<version>, with its CRDs beside it; the tests run it against
// the local control plane to fetch documents from a Git repository (issue 44).
package tools

import _ "github.com/fluxcd/source-controller"
