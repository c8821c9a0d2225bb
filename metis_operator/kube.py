"""The operator's access to the Kubernetes API: plain JSON dicts by path, async.

Why not the generated typed client: manifests are built and compared as the API
server's own JSON (camelCase, as `kubectl get -o json` shows them), and the
children need server-side apply, which the typed methods do not express. The
`kubernetes` package still does the part worth reusing: kubeconfig and in-cluster
credentials (with token refresh), TLS and connection pooling. Its client is
blocking, so every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from kubernetes import client, config


class ApiError(Exception):
    """A non-2xx answer of the API server, with its status and its message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def path(api_version: str, plural: str, namespace: str | None, name: str | None = None) -> str:
    """`/api/v1/namespaces/ns/pods/name`, `/apis/apps/v1/...` and so on."""
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    out = root + (f"/namespaces/{quote(namespace)}" if namespace else "") + f"/{plural}"
    return out + (f"/{quote(name)}" if name else "")


_PLURALS = {
    "ConfigMap": "configmaps",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "Service": "services",
    "Deployment": "deployments",
    "Secret": "secrets",
    "NetworkPolicy": "networkpolicies",
}


def manifest_path(manifest: Mapping[str, Any]) -> str:
    meta = manifest["metadata"]
    return path(
        manifest["apiVersion"], _PLURALS[manifest["kind"]], meta.get("namespace"), meta["name"]
    )


class Cluster:
    """One API server, as the operator's credentials see it; every write names the
    field manager `manager`."""

    def __init__(
        self, api: client.ApiClient, timeout: float = 30.0, manager: str = "metis-operator"
    ) -> None:
        self._api = api
        self._timeout = timeout
        self.manager = manager

    @classmethod
    def connect(cls, manager: str = "metis-operator") -> Cluster:
        """In a pod, its service account; elsewhere, KUBECONFIG (as kubectl does)."""
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(client.ApiClient(), manager=manager)

    def request(
        self,
        method: str,
        url_path: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        request = self._api.param_serialize(
            method, url_path, query_params=list((query or {}).items()),
            header_params=headers, body=body, auth_settings=["BearerToken"],
        )  # fmt: skip
        response = self._api.call_api(*request, _request_timeout=self._timeout)
        data = response.read()
        if not 200 <= response.status <= 299:
            try:
                message = json.loads(data).get("message", "")
            except ValueError:
                message = data.decode(errors="replace")[:300]
            raise ApiError(response.status, message)
        return json.loads(data) if data else None

    async def call(self, method: str, url_path: str, **kw: Any) -> Any:
        return await asyncio.to_thread(self.request, method, url_path, **kw)

    async def get(self, url_path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return await self.call("GET", url_path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply: creates the object or brings the fields it names into
        shape, taking them over from whoever changed them (force)."""
        query = {"fieldManager": self.manager, "force": "true"}
        return await self.call(
            "PATCH", manifest_path(manifest), body=dict(manifest), query=query,
            content_type="application/apply-patch+yaml",
        )  # fmt: skip

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create once: an object that appeared meanwhile is read instead."""
        collection = manifest_path(manifest).rsplit("/", 1)[0]
        try:
            return await self.call(
                "POST", collection, body=dict(manifest), query={"fieldManager": self.manager}
            )
        except ApiError as e:
            if e.status != 409:
                raise
        found = await self.get(manifest_path(manifest))
        if found is None:
            raise ApiError(409, f"{manifest_path(manifest)} was created and deleted meanwhile")
        return found

    async def merge_patch(self, url_path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return await self.call(
            "PATCH", url_path, body=dict(patch), query={"fieldManager": self.manager},
            content_type="application/merge-patch+json",
        )  # fmt: skip

    async def post(self, url_path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.call("POST", url_path, body=dict(body))
