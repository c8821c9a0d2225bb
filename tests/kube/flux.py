"""What the tests of Flux sources share: the source-controller and a Git server as
fixtures, a base reading one Flux object on the stand-in kubelet, and its indexer asked.

The source-controller is module-scoped, so it starts before the operator of a test: its
CRDs must be served when the operator starts, or the operator does not watch their kinds
until it restarts."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from metis_dev.kubelet import Kubelet
from metis_dev.plane import ControlPlane
from tests.kube.operator_support import Operator, kb, model_service, wait_state
from tests.support.git_server import GitServer, git_server
from tests.support.model_server import ModelServer
from tests.support.source_controller import GROUP, SourceController, running_source_controller

BASE = "handbook"
"""The base's name, and its Flux object's."""


@pytest.fixture(scope="module")
def controller(
    kube: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SourceController]:
    with running_source_controller(kube, tmp_path_factory.mktemp("source-controller")) as c:
        yield c


@pytest.fixture
def server(tmp_path: Path) -> Iterator[GitServer]:
    with git_server(tmp_path / "git-server") as s:
        yield s


@pytest.fixture
def kubelet(kube: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Kubelet]:
    with Kubelet(kube, namespace, tmp_path / "kubelet") as k:
        yield k


@pytest.fixture
def reading(
    kube: ControlPlane,
    controller: SourceController,
    operator: Operator,
    kubelet: Kubelet,
    namespace: str,
    node_object: str,
) -> Callable[[str], Reading]:
    """A base of the test's namespace reading one Flux object of a kind, its pod on the
    test's own node object (gone after the test: a node left behind takes the next tests'
    pods)."""
    return lambda kind: Reading(kube, namespace, kind, operator, controller, kubelet)


def fetch_now(kube: ControlPlane, ns: str, plural: str, name: str = BASE) -> str:
    """What `flux reconcile source` asks: a fetch now, not at the interval's end; the value
    it wrote."""
    path = f"/apis/{GROUP}/v1/namespaces/{ns}/{plural}/{name}"
    stamp = datetime.now(UTC).isoformat()
    patch = {"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": stamp}}}
    kube.rest().patch(path, patch)
    return stamp


@dataclass
class Reading:
    """A base of the stand-in kubelet that reads one Flux object of `kind`."""

    kube: ControlPlane
    ns: str
    kind: str
    operator: Operator
    controller: SourceController
    kubelet: Kubelet

    def alive(self) -> None:
        self.operator.check_alive()
        self.controller.check_alive()

    def start(self, models: ModelServer) -> Reading:
        """The model Service for it, and the base applied."""
        model_service(self.kube, self.ns, "minilm", int(models.base_url.rsplit(":", 1)[1]))
        spec = {
            "sources": [{"flux": {"kind": self.kind, "name": BASE}}],
            "embedding": {"deployment": "minilm"},
            "rescan_seconds": 0,
        }
        self.kube.kubectl("apply", "-n", self.ns, "-f", "-", input=json.dumps(kb(BASE, spec)))
        return self

    def apply(self, obj: dict[str, Any]) -> None:
        self.kube.kubectl("apply", "-n", self.ns, "-f", "-", input=json.dumps(obj))

    def wait(
        self, state: str, check: Callable[[dict[str, Any]], bool] = lambda s: True
    ) -> dict[str, Any]:
        return wait_state(
            self.kube, self.ns, BASE, state, alive=self.alive, timeout=240, check=check
        )

    def indexed(self, revision: str) -> dict[str, Any]:
        """The status once the base is Ready with `revision` indexed."""
        return self.wait(
            "Ready", lambda s: s["observed"].get("indexed_revisions") == {BASE: revision}
        )

    def documents(self) -> dict[str, int]:
        """The base's documents and their chunks, as its indexer lists them."""
        indexer = self.kubelet.indexer()
        rows = indexer.get("/v1/documents", params={"page_size": 100}).json()["documents"]
        return {r["document"]: r["chunks"] for r in rows if r["source"] == BASE}

    def top(self, question: str) -> str | None:
        """The document that answers `question` first, by words."""
        asked = {"query": question, "mode": "keyword"}
        answer = self.kubelet.indexer().post("/v1/search", asked).json()
        return answer["results"][0]["citation"]["document"] if answer["results"] else None

    def last_pass(self) -> dict[str, int]:
        return dict(self.kubelet.indexer().status()["last_pass"])
