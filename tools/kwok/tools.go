//go:build tools

// Package tools pins kwok (sigs.k8s.io/kwok/cmd/kwok): tools/kwok/build.sh builds it from this
// module into ~/.cache/metis/kwok/<version>; bench/operator_kwok.py runs it as a controller
// against the local control plane (fake Nodes, and their pods reported Running).
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
