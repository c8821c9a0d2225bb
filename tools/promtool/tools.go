//go:build tools

// Package tools pins promtool (github.com/prometheus/prometheus/cmd/promtool): `make promtool`
// builds it from this module into ~/.cache/metis/promtool/<version>.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
