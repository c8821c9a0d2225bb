"""Access to the Kubernetes API for the operator, `kubectl metis` and the console: plain
JSON dicts by path.

Why not the generated typed client: manifests are built and compared as the API
server's own JSON (camelCase, as `kubectl get -o json` shows them), and the
children need server-side apply, which the typed methods do not express. The
`kubernetes` package still does the parts worth reusing: kubeconfig and in-cluster
credentials (with token refresh), TLS, connection pooling and the reading of a watch's
stream. Its client is blocking: `Cluster.request` and `Cluster.watch` block (the plugin
and the console's watch threads call them so), and the operator's async methods run
each call in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
from collections.abc import Generator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import yaml
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

Query = Mapping[str, str | int]


class ApiError(Exception):
    """A non-2xx answer of the API server: its status and reason phrase (`403 Forbidden`),
    its message, and its body (JSON, or the text of an answer that is not JSON: a proxied
    service's own)."""

    def __init__(self, status: int, message: str, body: Any = None, reason: str = "") -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.body = body
        self.reason = reason


class ConfigError(Exception):
    """No credentials to reach the API server with: no (valid) kubeconfig, or not in a pod."""


@contextlib.contextmanager
def _loading() -> Iterator[None]:
    """The `kubernetes` package's ways of failing to load credentials, as one error."""
    try:
        yield
    except (config.ConfigException, OSError, yaml.YAMLError) as e:
        raise ConfigError(str(e)) from e


CALLS_AT_ONCE = 32
"""API calls the operator has in flight at once: its worker threads, and the connections
kept to the API server. The defaults (Python's min(32, cores + 4) threads, the client's
cores × 5 connections) made 100 bases changing together queue behind six threads on two
cores (bench/results/operator-kwok.md)."""


STATUS_CALLS = 8
"""Threads of their own for status writes: a status is what a user waits on, and while a
hundred bases changed at once a base's status write queued behind the other bases'
applies and Events (bench/results/operator-kwok.md)."""


def _configuration() -> client.Configuration:
    configuration = client.Configuration()
    configuration.connection_pool_maxsize = CALLS_AT_ONCE + STATUS_CALLS
    return configuration


def in_cluster() -> client.ApiClient:
    """The pod's service account."""
    configuration = _configuration()
    with _loading():
        config.load_incluster_config(client_configuration=configuration)
    return client.ApiClient(configuration)


def from_kubeconfig(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """A kubeconfig file's credentials, as kubectl reads them: `kubeconfig` or $KUBECONFIG
    (else ~/.kube/config), its current context or `context`."""
    with _loading():
        return config.new_client_from_config(
            config_file=kubeconfig, context=context, client_configuration=_configuration()
        )


def kubeconfig_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The namespace that kubectl uses without `-n`: the context's, else "default"."""
    with _loading():
        contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
    if context:
        current = next((c for c in contexts if c["name"] == context), current)
    return (current.get("context") or {}).get("namespace") or "default"


def path(api_version: str, plural: str, namespace: str | None, name: str | None = None) -> str:
    """`/api/v1/namespaces/ns/pods/name`, `/apis/apps/v1/...` and so on."""
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    out = root + (f"/namespaces/{quote(namespace)}" if namespace else "") + f"/{plural}"
    return out + (f"/{quote(name)}" if name else "")


@dataclasses.dataclass(frozen=True)
class Resource:
    """A kind of object the operator lists, watches or writes, as the API server's paths
    name it."""

    kind: str
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES = (
    Resource("PersistentVolumeClaim", "", "v1", "persistentvolumeclaims"),
    Resource("Service", "", "v1", "services"),
    Resource("Deployment", "apps", "v1", "deployments"),
    Resource("StatefulSet", "apps", "v1", "statefulsets"),
    Resource("ConfigMap", "", "v1", "configmaps"),
    Resource("NetworkPolicy", "networking.k8s.io", "v1", "networkpolicies"),
    Resource("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets"),
    Resource("Pod", "", "v1", "pods"),
    Resource("Secret", "", "v1", "secrets"),
    Resource("GitRepository", "source.toolkit.fluxcd.io", "v1", "gitrepositories"),
    Resource("Bucket", "source.toolkit.fluxcd.io", "v1", "buckets"),
    Resource("OCIRepository", "source.toolkit.fluxcd.io", "v1", "ocirepositories"),
)
"""Every kind of the operator's vocabulary besides its own (the KnowledgeBase, api/):
what it watches (cache.WATCHED picks them: Flux's source objects too, where Flux is
installed) and the base's Secret, read by name."""
RESOURCE = {r.kind: r for r in RESOURCES}


def manifest_path(manifest: Mapping[str, Any]) -> str:
    meta = manifest["metadata"]
    plural = RESOURCE[manifest["kind"]].plural
    return path(manifest["apiVersion"], plural, meta.get("namespace"), meta["name"])


def _parsed(raw: bytes | str | None) -> Any:
    """An answer's body: its JSON, else its text; None when empty."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace") if isinstance(raw, bytes) else raw


def _refusal(status: int, reason: str | None, raw: bytes | str | None) -> ApiError:
    body = _parsed(raw)
    message = body.get("message", "") if isinstance(body, dict) else str(body or "")[:300]
    return ApiError(status, message, body, reason or "")


class Cluster:
    """One API server, as one set of credentials sees it; every write names the
    field manager `manager`."""

    def __init__(
        self, api: client.ApiClient, timeout: float = 30.0, manager: str = "metis-operator"
    ) -> None:
        self._api = api
        self._timeout = timeout
        self.manager = manager
        self._threads = ThreadPoolExecutor(CALLS_AT_ONCE, thread_name_prefix="kube")
        self._status_threads = ThreadPoolExecutor(STATUS_CALLS, thread_name_prefix="kube-status")

    @classmethod
    def connect(cls, manager: str = "metis-operator") -> Cluster:
        """In a pod, its service account; elsewhere, KUBECONFIG (as kubectl does)."""
        try:
            api = in_cluster()
        except ConfigError:
            api = from_kubeconfig()
        return cls(api, manager=manager)

    def _send(
        self,
        method: str,
        url_path: str,
        body: Any,
        query: Query | None,
        content_type: str,
        timeout: float,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """One call, its answer not read yet (a watch streams it); non-2xx as ApiError."""
        headers = {"Accept": "application/json", "Content-Type": content_type, **(headers or {})}
        request = self._api.param_serialize(
            method,
            url_path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(*request, _request_timeout=timeout)
        except ApiException as e:  # refused before an answer (TLS, or retries spent)
            raise _refusal(int(e.status or 500), e.reason, e.body) from None
        if not 200 <= response.status <= 299:
            raise _refusal(response.status, response.reason, response.read())
        return response

    def request(
        self,
        method: str,
        url_path: str,
        body: Any = None,
        query: Query | None = None,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """One call: the answer's JSON (None when empty); non-2xx as ApiError. `headers`: more
        of them (the API server passes them on through its proxy)."""
        response = self._send(method, url_path, body, query, content_type, self._timeout, headers)
        return _parsed(response.read())

    def watch(
        self, url_path: str, resource_version: str, seconds: int, query: Query | None = None
    ) -> Generator[tuple[str, dict[str, Any]], None, None]:
        """The changes to the collection `url_path` after `resource_version`, as
        (type, object), until the API server ends the watch after `seconds`. An
        expired `resource_version` is ApiError 410: list again."""
        stream = watch.Watch().stream(
            self._watch_once,
            url_path,
            dict(query or {}),
            resource_version=resource_version,
            timeout_seconds=seconds,
        )
        try:
            for event in stream:
                yield event["type"], event["raw_object"]
        except ApiException as e:  # an ERROR event (410 Gone, or refused)
            raise ApiError(int(e.status or 500), str(e.reason), reason=str(e.reason)) from None
        finally:
            stream.close()

    def _watch_once(
        self,
        url_path: str,
        query: Query,
        *,
        watch: bool,
        resource_version: str,
        timeout_seconds: int,
        _preload_content: bool,
    ) -> Any:
        """One watch request, called as `kubernetes.watch.Watch` calls a list function:
        the streaming response, which the Watch reads line by line."""
        params = {
            **query,
            "watch": watch,
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout_seconds,
        }
        timeout = timeout_seconds + self._timeout
        return self._send("GET", url_path, None, params, "application/json", timeout).response

    async def call(self, method: str, url_path: str, **kw: Any) -> Any:
        """`request` in one of the cluster's own threads (not the loop's default pool,
        which other blocking work shares); a status write in one of those kept for them."""
        work = functools.partial(self.request, method, url_path, **kw)
        status = method == "PATCH" and url_path.endswith("/status")
        threads = self._status_threads if status else self._threads
        return await asyncio.get_running_loop().run_in_executor(threads, work)

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
            "PATCH",
            manifest_path(manifest),
            body=dict(manifest),
            query=query,
            content_type="application/apply-patch+yaml",
        )

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

    async def delete(self, url_path: str) -> None:
        """Delete the object and, in the background, what it owns; one already gone is
        no error."""
        try:
            await self.call("DELETE", url_path, body={"propagationPolicy": "Background"})
        except ApiError as e:
            if e.status != 404:
                raise

    async def merge_patch(self, url_path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return await self.call(
            "PATCH",
            url_path,
            body=dict(patch),
            query={"fieldManager": self.manager},
            content_type="application/merge-patch+json",
        )

    async def post(self, url_path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.call("POST", url_path, body=dict(body))
