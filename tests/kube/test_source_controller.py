"""Flux's source-controller on the real control plane, fetching a real Git repository over
HTTP on loopback (issue 44): a GitRepository gets an artifact at the pushed commit, whose
tarball holds the committed files and matches its advertised digest; a new commit is fetched
when the object asks for a reconcile (reconcile.fluxcd.io/requestedAt), as `flux reconcile
source git` does, not only at the interval's end, and so is a branch rewritten by a force-push."""

from __future__ import annotations

import hashlib
import io
import secrets
import tarfile
from typing import Any

import httpx

from metis_dev.plane import ControlPlane
from metis_dev.process import wait_for
from tests.kube.conftest import fresh_namespace
from tests.kube.flux import controller, fetch_now, server
from tests.support.git_server import GitServer
from tests.support.source_controller import GROUP, SourceController

__all__ = ["controller", "server"]  # fixtures

FETCH_TIMEOUT = 120.0
"""Seconds for a fetch to show in the status: the first includes the informers' start."""


def git_repository_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/v1/namespaces/{namespace}/gitrepositories/{name}"


def wait_artifact(
    kube: ControlPlane, controller: SourceController, path: str, revision: str
) -> dict[str, Any]:
    """status.artifact once it is at `revision`; the controller's log on a timeout."""

    def artifact() -> dict[str, Any] | None:
        found = kube.rest().get(path).get("status", {}).get("artifact")
        return found if found and found["revision"] == revision else None

    try:
        return wait_for(
            artifact, timeout=FETCH_TIMEOUT, what=revision, alive=controller.check_alive
        )
    except TimeoutError as exc:
        status = kube.rest().get(path).get("status")
        raise AssertionError(f"{exc}\nstatus: {status}\n{controller.log()}") from None


def tarball(artifact: dict[str, Any]) -> dict[str, bytes]:
    """The files of the artifact's tarball, after checking it against its digest."""
    data = httpx.get(artifact["url"], timeout=30).raise_for_status().content
    assert artifact["digest"] == f"sha256:{hashlib.sha256(data).hexdigest()}"
    files = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            content = tar.extractfile(member)  # None for a folder
            if content is not None:
                files[member.name] = content.read()
    return files


def test_git_repository_fetched_and_refetched_on_request(
    kube: ControlPlane, controller: SourceController, server: GitServer
) -> None:
    repo = server.create("handbook")
    first = repo.commit(
        {"README.md": "# Handbook\n", "docs/leave.md": "Ask two weeks ahead.\n"}, "first"
    )
    with fresh_namespace(kube, f"t-{secrets.token_hex(4)}") as namespace:
        path = git_repository_path(namespace, "handbook")
        kube.rest().post(
            f"/apis/{GROUP}/v1/namespaces/{namespace}/gitrepositories",
            {
                "apiVersion": f"{GROUP}/v1",
                "kind": "GitRepository",
                "metadata": {"name": "handbook", "namespace": namespace},
                "spec": {
                    "url": server.url("handbook"),
                    "interval": "1m",
                    "ref": {"branch": "main"},
                },
            },
        )

        artifact = wait_artifact(kube, controller, path, f"main@sha1:{first}")
        assert artifact["url"].startswith(f"{controller.artifacts_url}/gitrepository/")
        assert tarball(artifact) == {
            "README.md": b"# Handbook\n",
            "docs/leave.md": b"Ask two weeks ahead.\n",
        }

        second = repo.commit(
            {"docs/leave.md": "Ask three weeks ahead.\n", "docs/travel.md": "Book early.\n"},
            "second",
        )
        requested = fetch_now(kube, namespace, "gitrepositories")
        artifact = wait_artifact(kube, controller, path, f"main@sha1:{second}")
        assert tarball(artifact) == {
            "README.md": b"# Handbook\n",
            "docs/leave.md": b"Ask three weeks ahead.\n",
            "docs/travel.md": b"Book early.\n",
        }
        assert kube.rest().get(path)["status"]["lastHandledReconcileAt"] == requested

        # History rewritten: the branch's head replaced by a force-push.
        rewritten = repo.commit({"docs/travel.md": None}, "second, without travel", amend=True)
        fetch_now(kube, namespace, "gitrepositories")
        artifact = wait_artifact(kube, controller, path, f"main@sha1:{rewritten}")
        assert tarball(artifact) == {
            "README.md": b"# Handbook\n",
            "docs/leave.md": b"Ask three weeks ahead.\n",
        }
