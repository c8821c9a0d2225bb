"""Tests against a real Kubernetes control plane built from Go modules (see README.md)."""
