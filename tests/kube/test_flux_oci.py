"""A base that reads a Flux OCIRepository (issue 44): documents pushed as an OCI artifact
(Flux's media types, as `flux push artifact` writes them) to a real registry on loopback
(the CNCF distribution registry, Debian's docker-registry, with htpasswd auth), fetched by
Flux's source-controller, read by a real indexer. The tag moved to new content is read
exactly: one file changed, one file read."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.kube.flux import BASE, Reading, controller, fetch_now, kubelet, reading
from tests.node.registry import USER, Registry, serving
from tests.support.model_server import ModelServer
from tests.support.source_controller import GROUP

__all__ = ["controller", "kubelet", "reading"]  # fixtures

REPOSITORY = "docs/handbook"
CONFIG = "application/vnd.cncf.flux.config.v1+json"
CONTENT = "application/vnd.cncf.flux.content.v1.tar+gzip"
FILES = {
    "leave.md": "# Leave\n\nTwenty-five days of paid leave a year; ask two weeks ahead.\n",
    "security.md": "# Security\n\nLock your screen whenever you leave your desk.\n",
}


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    folder = tmp_path / "registry"
    folder.mkdir()
    with serving(folder) as r:
        yield r


def push(registry: Registry, files: dict[str, str], tag: str = "latest") -> str:
    """`files` as a Flux artifact at `tag`; the manifest's digest."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blobs = {CONFIG: b"{}", CONTENT: out.getvalue()}
    auth = (USER, registry.password)
    base = f"http://{registry.host}/v2/{REPOSITORY}"
    described = {}
    with httpx.Client(auth=auth, timeout=30) as http:
        for media, data in blobs.items():
            digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
            started = http.post(f"{base}/blobs/uploads/")
            assert started.status_code == 202, started.text
            location = httpx.URL(started.headers["Location"])
            if not location.is_absolute_url:
                location = httpx.URL(f"http://{registry.host}").join(location)
            put = http.put(
                location.copy_add_param("digest", digest),
                content=data,
                headers={"Content-Type": "application/octet-stream"},
            )
            assert put.status_code == 201, put.text
            described[media] = {"mediaType": media, "digest": digest, "size": len(data)}
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": described[CONFIG],
            "layers": [described[CONTENT]],
        }
        body = json.dumps(manifest).encode()
        put = http.put(
            f"{base}/manifests/{tag}",
            content=body,
            headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"},
        )
        assert put.status_code == 201, put.text
    return f"sha256:{hashlib.sha256(body).hexdigest()}"


def pull_secret(registry: Registry) -> dict[str, object]:
    login = f"{USER}:{registry.password}"
    auths = {
        registry.host: {
            "username": USER,
            "password": registry.password,
            "auth": base64.b64encode(login.encode()).decode(),
        }
    }
    config = base64.b64encode(json.dumps({"auths": auths}).encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "registry"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": config},
    }


def test_an_oci_artifact_is_read_at_its_digest_and_a_moved_tag_exactly(
    reading: Callable[[str], Reading],
    models: ModelServer,
    registry: Registry,
) -> None:
    first = push(registry, FILES)
    base = reading("OCIRepository")
    base.apply(pull_secret(registry))
    base.apply(
        {
            "apiVersion": f"{GROUP}/v1",
            "kind": "OCIRepository",
            "metadata": {"name": BASE},
            "spec": {
                "url": f"oci://{registry.host}/{REPOSITORY}",
                "ref": {"tag": "latest"},
                "interval": "10m",
                "insecure": True,
                "secretRef": {"name": "registry"},
            },
        }
    )
    s = base.start(models).indexed(f"latest@{first}")
    assert s["observed"]["revisions"] == {BASE: f"latest@{first}"}
    assert set(base.documents()) == set(FILES)

    moved = push(registry, {**FILES, "leave.md": "# Leave\n\nThe zebra rule applies now.\n"})
    fetch_now(base.kube, base.ns, "ocirepositories")
    base.indexed(f"latest@{moved}")
    assert base.top("zebra rule") == "leave.md"
    assert base.last_pass() == {"read": 1, "unchanged": 0, "dropped": 0}
