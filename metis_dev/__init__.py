"""Metis' developer tools: a local Kubernetes control plane built from Go modules, with a
stand-in kubelet that runs indexer pods as local processes (`metis-dev cluster up`), shaped
like controller-runtime's envtest (pki, process, components, plane, rest, kubelet). The
operator's tests and `make demo` use the same package. See metis_dev/README.md."""
