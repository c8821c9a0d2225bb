//go:build tools

// Package tools pins helm (helm.sh/helm/v4/cmd/helm): `make helm` builds it from this module
// into ~/.cache/metis/helm/<version>; the chart tests (tests/repository/test_chart.py,
// tests/kube/test_helm.py) run it.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
