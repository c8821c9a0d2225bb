"""Tests against a real Kubernetes control plane built from Go modules (docs/local-cluster.md)."""
