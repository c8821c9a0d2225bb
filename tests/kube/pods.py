"""Where the operator's end-to-end tests run indexer pods, behind one interface:

- `RealPods`: the machine's real node (metis_dev.node: containerd, kubelet, kube-proxy,
  the project's indexer image under the Deployment's security settings); the operator
  reaches Services by their in-cluster names through the node's DNS, as in a cluster;
- `StandInPods`: metis_dev.kubelet's stand-in, indexers as local `metis serve`
  processes on loopback ports, where the machine cannot run a real node (not root, the
  packages missing, or its one node busy with another run) — and the run says so.

`held()` is the one control the tests need over a kubelet: pods bound meanwhile do
not start and ConfigMap changes do not reach running pods (the real node's kubelet is
frozen with SIGSTOP: what a stalled node's kubelet does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx

from metis_dev import images, node
from metis_dev.kubelet import IndexerClient, Kubelet
from metis_dev.plane import ControlPlane
from metis_dev.process import free_port
from tests.kube.operator_support import Operator, install, make_drive, model_service
from tests.support.model_server import ModelServer, start_model_server

INDEXER_PORT = 7700
"""The operator's default indexer port: the real node's pods listen there."""


class Indexer(Protocol):
    def get(self, path: str, **kw: Any) -> httpx.Response: ...
    def post(self, path: str, body: dict[str, Any] | None = None) -> httpx.Response: ...
    def status(self) -> dict[str, Any]: ...


class Pods(Protocol):
    kind: str
    namespace: str

    def indexer(self, base: str) -> Indexer: ...
    def check(self) -> None: ...
    def held(self) -> contextlib.AbstractContextManager[None]: ...
    def machine(self, labels: dict[str, str]) -> contextlib.AbstractContextManager[str]: ...
    def drive(self, name: str, folder: Path) -> None: ...
    def model_service(self, name: str, port: int, *, selector: bool = False) -> None: ...
    def models(self, port: int | None = None) -> ModelServer: ...
    def operator(self, workdir: Path, **kw: Any) -> Operator:
        """The operator for this test's namespace alone: the bases other tests left behind
        (their namespaces are deleted without waiting) are not its business."""
        ...

    def install(self) -> None: ...

    host: str
    """Where a server of the host listens for the pods and the operator."""


def port_of(server: ModelServer) -> int:
    return int(server.base_url.rsplit(":", 1)[1])


@dataclasses.dataclass
class StandInPods:
    kube: ControlPlane
    namespace: str
    kubelet: Kubelet
    kind: str = "the stand-in kubelet"
    host: str = "127.0.0.1"
    indexer_port: int = dataclasses.field(default_factory=free_port)

    def indexer(self, base: str) -> Indexer:
        return self.kubelet.indexer()

    def check(self) -> None:
        self.kubelet.check()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.kubelet.hold = self.kubelet.late_config = True
        try:
            yield
        finally:
            self.kubelet.hold = self.kubelet.late_config = False

    @contextlib.contextmanager
    def machine(self, labels: dict[str, str]) -> Iterator[str]:
        """A node object of its own with `labels` (the stand-in runs what lands on it)."""
        name = f"cpu-{secrets.token_hex(3)}"
        self.kube.add_node(name, labels)
        try:
            yield name
        finally:
            self.kube.kubectl(
                "delete", "node", name, "--ignore-not-found", "--wait=false", check=False
            )

    def drive(self, name: str, folder: Path) -> None:
        make_drive(self.kube, self.namespace, name, folder)

    def model_service(self, name: str, port: int, *, selector: bool = False) -> None:
        model_service(
            self.kube, self.namespace, name, port, selector={"app": name} if selector else None
        )

    def models(self, port: int | None = None) -> ModelServer:
        return start_model_server(port=port)

    def operator(self, workdir: Path, **kw: Any) -> Operator:
        return Operator(self.kube, workdir, self.indexer_port, namespaces=(self.namespace,), **kw)

    def install(self) -> None:
        install(self.kube)


@dataclasses.dataclass
class RealPods:
    kube: ControlPlane
    namespace: str
    node: node.Node
    image: str
    kind: str = "the real node"
    host: str = node.GATEWAY

    def indexer(self, base: str) -> Indexer:
        svc = self.kube.rest().get(f"/api/v1/namespaces/{self.namespace}/services/metis-{base}")
        return IndexerClient(f"http://{svc['spec']['clusterIP']}:{INDEXER_PORT}")

    def check(self) -> None:
        self.node.check()

    def held(self) -> contextlib.AbstractContextManager[None]:
        return self.node.frozen()

    @contextlib.contextmanager
    def machine(self, labels: dict[str, str]) -> Iterator[str]:
        """The node itself, labelled for the test (and the labels removed after)."""
        pairs = [f"{k}={v}" for k, v in labels.items()]
        self.kube.kubectl("label", "node", node.NODE_NAME, "--overwrite", *pairs)
        try:
            yield node.NODE_NAME
        finally:
            self.kube.kubectl(
                "label", "node", node.NODE_NAME, *(f"{k}-" for k in labels), check=False
            )

    def drive(self, name: str, folder: Path) -> None:
        """A drive the pod's user (10001) may read: a hostPath mount shows the folder
        itself, whatever the folders above it allow."""
        folder.chmod(0o755)
        make_drive(self.kube, self.namespace, name, folder)

    def model_service(self, name: str, port: int, *, selector: bool = False) -> None:
        """Port 80 with an EndpointSlice naming the host's model server on the pods'
        bridge; with `selector`, the Service also selects `app: <name>` (a model
        Deployment the test scales), whose endpoints the controller keeps apart."""
        objects = node.model_service(self.namespace, name, port)
        if selector:
            objects[0]["spec"]["selector"] = {"app": name}
        body = {"apiVersion": "v1", "kind": "List", "items": objects}
        self.kube.kubectl("apply", "-n", self.namespace, "-f", "-", input=json.dumps(body))

    def models(self, port: int | None = None) -> ModelServer:
        return start_model_server(host=self.host, port=port)

    def operator(self, workdir: Path, **kw: Any) -> Operator:
        env = {"METIS_INDEXER_IMAGE": self.image, **kw.pop("env", {})}
        return Operator(
            self.kube,
            workdir,
            INDEXER_PORT,
            url_template=None,
            wrap=self.node.host_command,
            env=env,
            namespaces=(self.namespace,),
            **kw,
        )

    def install(self) -> None:
        """manifests/, its operator Deployment scaled to none: the tests run the operator
        here, and the node would try to pull its image."""
        install(self.kube)
        scale_operator_to_zero(self.kube)


def scale_operator_to_zero(kube: ControlPlane) -> None:
    kube.kubectl("scale", "deployment/metis-operator", "-n", "metis-system", "--replicas=0")


@contextlib.contextmanager
def real_node(
    kube: ControlPlane, work: Path, claimed: int | None = None
) -> Iterator[tuple[node.Node, str]]:
    """The machine's real node registered with `kube`, the indexer image loaded: the
    node and the image's name. The caller checks `node.unusable()` (and may have
    `claimed` the node already)."""
    built = images.build()
    image = built.refs[images.INDEXER.name]
    assets = node.ensure_binaries()
    with node.Node(Path(kube.kubeconfig), work, assets, claimed=claimed) as n:
        n.load(images.Podman(), image)
        print(f"\nreal node {node.NODE_NAME} Ready in {n.started_in:.1f} s ({work})")
        yield n, image
