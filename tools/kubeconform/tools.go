//go:build tools

// Package tools pins kubeconform (github.com/yannh/kubeconform/cmd/kubeconform): `make
// kubeconform` builds it from this module into ~/.cache/metis/kubeconform/<version>; the chart
// tests validate the rendered chart with it, offline, against schemas they make themselves.
package tools

import _ "github.com/yannh/kubeconform/cmd/kubeconform"
