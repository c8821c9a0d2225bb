"""Fixtures of the real-node tests: the control plane of tests/kube (its `kube`
fixture, re-exported), the project's images, a real node running them, and a release of
them in a real registry on loopback (`registry`, `released`: tests/node/registry.py), made
once per session for test_release.py and test_readme.py.

They skip, saying why, only where the machine cannot run a real node (not root, or
the Debian packages of `make node-packages` missing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from metis_dev import images, node
from tests.kube import conftest as kube_conftest
from tests.kube.conftest import ControlPlane, kube, kube_binaries, kubectl, namespace
from tests.kube.pods import real_node as real_node_of
from tests.node import registry as registry_of

__all__ = [
    "built",
    "kube",
    "kube_binaries",
    "kubectl",
    "namespace",
    "real_node",
    "registry",
    "released",
]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build what is missing before the first test, not inside a test's timeout: the
    control plane (tests/kube's hook) and, where a node can run, kubelet and kube-proxy
    (many minutes cold on two cores) and the images."""
    kube_conftest.pytest_collection_finish(session)
    wants = any("real_node" in getattr(i, "fixturenames", ()) for i in session.items)
    if not wants or node.unusable():
        return
    capture = session.config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        node.ensure_binaries()
        images.build()
        return
    with capture.global_and_fixture_disabled():
        node.ensure_binaries()
        images.build()


@pytest.fixture(scope="session")
def built() -> images.Built:
    """Both images and their base, built once per set of inputs (cached)."""
    why = node.unusable()
    if why:
        pytest.skip(f"no real node on this machine: {why}")
    return images.build()


@pytest.fixture(scope="module")
def real_node(
    built: images.Built, kube: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[node.Node]:
    """containerd, kubelet and kube-proxy registered with the test control plane,
    the indexer image loaded; for one module (the node leaves the cluster after it)."""
    claimed, why = node.claim_or_why()
    if claimed is None:
        pytest.skip(f"no real node now: {why}")
    with real_node_of(kube, Path(tmp_path_factory.mktemp("node")), claimed) as (n, _):
        registry_of.forget_pulled(n)  # a release's name for the image is not this module's
        try:
            yield n
        finally:
            registry_of.forget_pulled(n)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[registry_of.Registry]:
    """`docker-registry serve` on a free loopback port, with password auth, until the
    session ends."""
    with registry_of.serving(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture(scope="session")
def released(
    built: images.Built, registry: registry_of.Registry, tmp_path_factory: pytest.TempPathFactory
) -> registry_of.Released:
    """`make release` into `registry`, once per session: what it recorded (digests.json),
    its folder and its output."""
    return registry_of.make_release(registry, tmp_path_factory.mktemp("release"))
