"""A base that reads a Flux Bucket (issue 44): documents as objects in a real S3-compatible
server on loopback (versitygw, checking SigV4 signatures against the key pair of the Bucket's
Secret), fetched by Flux's source-controller (its generic provider, minio-go), read by a real
indexer. One object overwritten is read exactly: one file changed, one file read."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metis_dev.plane import ControlPlane
from metis_dev.process import wait_for
from tests.kube.flux import BASE, Reading, controller, fetch_now, kubelet, reading
from tests.support.model_server import ModelServer
from tests.support.s3_server import S3Server, s3_server
from tests.support.source_controller import GROUP

__all__ = ["controller", "kubelet", "reading"]  # fixtures

BUCKET = "handbook-docs"
SECRET = "handbook-s3"
FILES = {
    "leave.md": "# Leave\n\nTwenty-five days of paid leave a year; ask two weeks ahead.\n",
    "security.md": "# Security\n\nLock your screen whenever you leave your desk.\n",
    "policies/travel.md": "# Travel\n\nBook trains second class; flights only beyond six hours.\n",
}


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3Server]:
    with s3_server(tmp_path / "s3-server") as s:
        yield s


def bucket(endpoint: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Bucket",
        "metadata": {"name": BASE},
        "spec": {
            "provider": "generic",
            "bucketName": BUCKET,
            "endpoint": endpoint,
            "insecure": True,  # plain HTTP
            "interval": "10m",
            "secretRef": {"name": SECRET},
        },
    }


def secret(s3: S3Server) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET},
        "stringData": {"accesskey": s3.access_key, "secretkey": s3.secret_key},
    }


def artifact_revision(kube: ControlPlane, ns: str, other_than: str | None = None) -> str | None:
    """The Bucket's artifact revision once it is Ready at one (other than `other_than`)."""
    path = f"/apis/{GROUP}/v1/namespaces/{ns}/buckets/{BASE}"
    status = kube.rest().get(path).get("status") or {}
    revision = (status.get("artifact") or {}).get("revision")
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return revision if ready and revision and revision != other_than else None


def test_a_bucket_is_read_at_its_revision_and_one_object_changed_exactly(
    reading: Callable[[str], Reading],
    models: ModelServer,
    s3: S3Server,
) -> None:
    base = reading("Bucket")

    def alive() -> None:
        base.alive()
        s3.check_alive()

    def fetched(other_than: str | None = None) -> str:
        return wait_for(
            lambda: artifact_revision(base.kube, base.ns, other_than),
            timeout=120,
            what=f"bucket/{BASE} Ready at a new revision ({base.controller.process.log_path})",
            alive=alive,
        )

    s3.make_bucket(BUCKET)
    for key, text in FILES.items():
        s3.put(BUCKET, key, text.encode())
    assert httpx.get(f"http://{s3.endpoint}/{BUCKET}").status_code == 403, "auth is checked"
    base.apply(secret(s3))
    base.apply(bucket(s3.endpoint))
    base.start(models)
    first = fetched()
    assert first.startswith("sha256:"), first
    s = base.indexed(first)
    assert s["observed"]["revisions"] == {BASE: first}
    assert set(base.documents()) == set(FILES)
    assert base.top("trains second class flights") == "policies/travel.md"

    s3.put(BUCKET, "leave.md", b"# Leave\n\nThirty days of paid leave a year; the zebra rule.\n")
    fetch_now(base.kube, base.ns, "buckets")
    second = fetched(other_than=first)
    assert second.startswith("sha256:"), second
    base.indexed(second)
    assert set(base.documents()) == set(FILES)
    assert base.top("zebra rule") == "leave.md"
    assert base.top("twenty-five weeks ahead") is None
    assert base.last_pass() == {"read": 1, "unchanged": 0, "dropped": 0}
