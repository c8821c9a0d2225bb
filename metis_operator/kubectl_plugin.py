"""`kubectl metis`: knowledge bases from where their users already are.

kubectl runs any `kubectl-<name>` on PATH as `kubectl <name>`, so the console script
`kubectl-metis` is the plugin. It reads the user's kubeconfig and context, like kubectl:

    kubectl metis status [BASE] [-n NS | -A]     a summary of one base, or a table of them
    kubectl metis search BASE "question" [--mode keyword] [--top-k 3]
    kubectl metis documents BASE --failed
    kubectl metis reindex BASE [--full]          the reindex annotation
    kubectl metis evaluate BASE [--k 10]         the evaluate annotation
    kubectl metis note add BASE "text" [--title T] [--replaces ID]   keep a note in the base
    kubectl metis note list BASE                 its notes, newest first
    kubectl metis note rm BASE ID                forget one
    kubectl metis backup BASE [--name N] [--wait]   a KnowledgeBaseBackup of the base
    kubectl metis backups [BASE]                 the backups, newest first
    kubectl metis restore NEW --from BACKUP [-f FILE] [--dry-run]   a new base from a backup

Searches, document lists and notes go through the API server's service proxy to the
base's Service, so no port-forward is needed: a user who may `get services/proxy` in the
namespace may ask. The proxy routes by the Service's Endpoints object and connects to a
pod's address from the API server's host; where it cannot (no endpoints controller, no
route to the pods: metis-dev's local cluster), `--url` asks the indexer at a URL instead,
a port-forward's or the stand-in's loopback port, and a failure of the proxy says so.
Writing or forgetting a note needs the base's token too, read from its
Secret (`metis-<name>`): a user who may read that Secret may write the base's notes.
Rendering is pure (the objects as the API server gives them in, a
base's status read through the models the operator writes it with, text out); the
edges are the shared client (metis_operator/kube.py) and the proxy.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import functools
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, get_args
from urllib.parse import urlsplit

import httpx
import yaml
from pydantic import ValidationError

from metis_indexer import schema
from metis_indexer.answer_text import answer_text, notes_text
from metis_indexer.schema import TOKEN_HEADER
from metis_operator import kube, plugin_backups
from metis_operator.api.backup import BackupStatus, stamped
from metis_operator.api.identity import (
    API_VERSION,
    BACKUP_PLURAL,
    EVALUATE,
    GROUP,
    KIND,
    PLURAL,
    REINDEX,
    backup_path,
)
from metis_operator.api.spec import KnowledgeBaseSpec
from metis_operator.api.status_types import IndexTotals, KnowledgeBaseStatus, Observed
from metis_operator.children import child_name

EVENTS_SHOWN = 8
"""The most recent Events `status` prints: enough to see the last state changes."""
WAIT_SECONDS = 2.0
"""Between looks at a backup `backup --wait` follows."""
REQUEST_SECONDS = 130
"""How long one call may take: a search through the service proxy, reranked, included."""
INDEXER_RUNS = frozenset({"Indexing", "Waiting", "Ready"})
"""The states in which a base's indexer runs and answers: a failure of the proxy then is
the path's, never "not ready"."""


class PluginError(Exception):
    """What the user must fix, said as one sentence naming what is missing."""


# --------------------------------------------------------------------------- rendering


def age(stamp: str | None, now: dt.datetime) -> str:
    """kubectl's short age: `42s`, `7m`, `3h`, `2d`; `-` without a time."""
    if not stamp:
        return "-"
    then = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _shown(value: object, default: str = "-") -> str:
    """A field of the status as printed: `default` where the status does not hold it."""
    return default if value is None else str(value)


def table(rows: Sequence[Sequence[str]]) -> str:
    """Columns padded as kubectl pads them (three spaces between)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def render_list(bases: Sequence[Mapping[str, Any]], now: dt.datetime, *, all_ns: bool) -> str:
    """`status` without a base: one line a base, as `kubectl get kb` with the reason."""
    if not bases:
        return "No knowledge bases found."
    head = ["NAMESPACE"] if all_ns else []
    rows = [[*head, "NAME", "STATE", "DOCUMENTS", "CHUNKS", "FAILED", "PROGRESS", "AGE", "REASON"]]
    for b in bases:
        meta = b["metadata"]
        st = KnowledgeBaseStatus.read(b.get("status"))
        ix = (st.observed or Observed()).index or IndexTotals()
        ns = [meta["namespace"]] if all_ns else []
        rows.append(
            [
                *ns,
                meta["name"],
                _shown(st.state),
                _shown(ix.documents),
                _shown(ix.chunks),
                _shown(ix.failed),
                _shown(st.progress),
                age(meta.get("creationTimestamp"), now),
                _shown(st.reason, ""),
            ]
        )
    return table(rows)


def render_backups(backups: Sequence[Mapping[str, Any]], now: dt.datetime) -> str:
    """`backups`: one line a backup, newest first, as `kubectl get kbbackup` with why."""
    if not backups:
        return "No backups found."
    rows = [["NAME", "BASE", "PHASE", "CHUNKS", "NOTES", "SIZE", "AGE", "MESSAGE"]]
    for b in sorted(
        backups, key=lambda b: b["metadata"].get("creationTimestamp") or "", reverse=True
    ):
        status = BackupStatus.read(b.get("status"))
        rows.append(
            [
                b["metadata"]["name"],
                _shown((b.get("spec") or {}).get("knowledge_base")),
                status.phase or "Pending",
                _shown(status.chunks),
                _shown(status.notes),
                _shown(status.size),
                age(b["metadata"].get("creationTimestamp"), now),
                _shown(status.message, ""),
            ]
        )
    return table(rows)


def render_status(
    base: Mapping[str, Any], events: Sequence[Mapping[str, Any]], now: dt.datetime
) -> str:
    """One base in sections read top to bottom: what it is, how far it got, why."""
    meta = base["metadata"]
    st = KnowledgeBaseStatus.read(base.get("status"))
    observed = st.observed or Observed()
    ix = observed.index or IndexTotals()
    try:
        spec: KnowledgeBaseSpec | None = KnowledgeBaseSpec.model_validate(base.get("spec") or {})
    except ValidationError:
        spec = None  # refused: its state and reason say why
    sources = (
        ", ".join(spec.sources_said(observed.revisions, observed.indexed_revisions)) if spec else ""
    )
    embedding = spec.embedding.deployment if spec else "-"
    reranker = spec.reranker.deployment if spec and spec.reranker else None
    lines = [
        f"Knowledge base:  {meta['namespace']}/{meta['name']}",
        f"State:           {_shown(st.state, 'unknown (not reconciled yet)')}",
    ]
    if st.reason:
        lines.append(f"Reason:          {st.reason}")
    lines += [
        f"Sources:         {sources or '-'}",
        f"Embedding:       {embedding}" + (f" · reranker {reranker}" if reranker else ""),
        f"Generation:      {meta.get('generation', '-')} "
        f"(observed {_shown(st.observed_generation)})",
        f"Address:         {_shown(observed.address)}",
        f"Machine:         {_shown(observed.machine)}",
        "",
        "Index",
        f"  Phase:         {_shown(ix.phase)}",
        f"  Documents:     {_shown(ix.documents)} ({_shown(ix.failed, '0')} failed)",
        f"  Notes:         {_shown(ix.notes, '0')}",
        f"  Chunks:        {_shown(ix.chunks)}",
    ]
    total, done = ix.pass_total, ix.pass_done
    if total:
        lines.append(f"  Pass:          {done}/{total} documents ({100 * (done or 0) // total} %)")
    lines.append(f"  Last indexed:  {_shown(ix.last_indexed_at, 'never')}")
    if observed.warnings:
        lines += ["", "Warnings", *(f"  - {w}" for w in observed.warnings)]
    ev = st.evaluation
    lines += ["", "Last evaluation"]
    if ev is not None and ev.recall_at_k is not None and ev.mrr is not None:
        lines.append(
            f"  recall@{ev.k} {ev.recall_at_k:.3f} · MRR {ev.mrr:.3f} over {ev.cases} questions "
            f"({age(ev.at, now)} ago)"
        )
    else:
        lines.append(f"  none (kubectl metis evaluate {meta['name']})")
    if st.conditions:
        rows = [["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]]
        rows += [
            [
                c.type,
                c.status,
                _shown(c.reason, ""),
                age(c.last_transition_time, now),
                _shown(c.message, ""),
            ]
            for c in st.conditions
        ]
        lines += ["", "Conditions", _indent(table(rows))]
    lines += ["", "Events"]
    if events:
        recent = sorted(events, key=_event_time)[-EVENTS_SHOWN:]
        rows = [["AGE", "TYPE", "REASON", "MESSAGE"]]
        rows += [
            [age(_event_time(e), now), e.get("type", ""), e.get("reason", ""), e.get("message", "")]
            for e in recent
        ]
        lines.append(_indent(table(rows)))
    else:
        lines.append("  none")
    return "\n".join(lines)


def _event_time(event: Mapping[str, Any]) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def render_documents(page: schema.DocumentsPage) -> str:
    """Documents with their state and, for a failed one, why: one a line."""
    if not page.documents:
        return "No documents."
    rows = [["SOURCE", "DOCUMENT", "KIND", "STATE", "WHY"]]
    for d in page.documents:
        why = ": ".join(p for p in (d.reason, d.detail) if p)
        rows.append([d.source, d.document, d.kind, d.state, why])
    shown = f"{len(page.documents)} of {page.total}"
    return table(rows) + (f"\n({shown} shown)" if len(page.documents) < page.total else "")


def reindex_value(full: bool, stamp: int) -> str:
    """The annotation's value: a new one each time (the operator acts on a change)."""
    return f"full {stamp}" if full else str(stamp)


def evaluate_value(k: int, stamp: int) -> str:
    return f"k={k} {stamp}"


def indexer_error(name: str, body: object) -> str | None:
    """The indexer's own refusal (`{"error": {"code", "message"}}`), as one line; None for
    an answer that is not the indexer's."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    return f"{name}: {error.get('code')}: {error.get('message')}"


def endpoints_missing(e: kube.ApiError) -> bool:
    """The proxy's own 404: the API server found no Endpoints object named after the
    Service. It names the request's resource, `services "metis-x" not found`, whether the
    Service exists or not, so only a look at the Service tells which is missing."""
    body = e.body if isinstance(e.body, dict) else {}
    details = body.get("details") or {}
    return e.status == 404 and body.get("kind") == "Status" and details.get("kind") == "services"


def _service_port(address: str | None) -> int | None:
    """The Service's port, from the base's `observed.address` (`http://metis-x.ns.svc:7700`)."""
    return urlsplit(address).port if address else None


def proxy_failure(base: Mapping[str, Any], e: kube.ApiError, service: bool | None) -> str:
    """Why the API server's proxy gave no answer of the indexer, said as what failed: a base
    whose indexer does not run yet is "not ready"; for one that runs, the path is named (its
    Service, the Endpoints the proxy routes by, the pod's address), with what to check and
    how to ask without the proxy. `service`: whether the Service exists (None: unknown)."""
    meta = base["metadata"]
    ns, name = meta["namespace"], meta["name"]
    st = KnowledgeBaseStatus.read(base.get("status"))
    if st.state not in INDEXER_RUNS:
        return (
            f"knowledge base {name} is not ready: it is {_shown(st.state, 'not reconciled yet')}"
            + (f" ({st.reason})" if st.reason else "")
            + f"; its indexer answers once it is Indexing or Ready (kubectl metis status {name}"
            f" -n {ns})"
        )
    svc, said = child_name(name), _api_message(e)
    if endpoints_missing(e) and service is False:
        cause = (
            f"Service {svc} does not exist; the operator creates it with the base, so check "
            f"that the operator runs and its Events (kubectl metis status {name} -n {ns})"
        )
    elif endpoints_missing(e) and service:
        cause = (
            f"Service {svc} exists but has no Endpoints object, which the proxy routes by (the "
            f"API server said: {said}); kube-controller-manager's endpoints controller writes "
            f"it: check kubectl get endpoints {svc} -n {ns}"
        )
    elif endpoints_missing(e):
        cause = (
            f"no Endpoints object of Service {svc} was found (the API server said: {said}); "
            f"check kubectl get service,endpoints {svc} -n {ns}"
        )
    elif e.status == 503:
        cause = (
            f"{said}; check that the indexer's pod is Ready (kubectl get pods -n {ns} -l "
            f"app.kubernetes.io/instance={name}) and that the API server's host can connect "
            f"to the address kubectl get endpoints {svc} -n {ns} lists"
        )
    else:
        cause = f"HTTP {e.status}: {said}"
    port = _service_port((st.observed or Observed()).address) or "PORT"
    return (
        f"the API server's proxy could not reach knowledge base {name} (it is {st.state}) "
        f"through Service {svc} in namespace {ns}: {cause}. To ask its indexer without the "
        f"proxy: kubectl port-forward -n {ns} svc/{svc} {port}, then add "
        f"--url http://127.0.0.1:{port} (on metis-dev's stand-in cluster the Service already "
        "answers there)"
    )


# --------------------------------------------------------------------------- the cluster


class Cluster:
    """The API server as the user's kubeconfig reaches it: the bases, their Events and
    their indexers, each failure said as a PluginError."""

    def __init__(self, kubeconfig: str | None, context: str | None) -> None:
        try:
            api = kube.from_kubeconfig(kubeconfig, context)
            self.default_namespace = kube.kubeconfig_namespace(kubeconfig, context)
        except kube.ConfigError as e:
            raise PluginError(f"no usable kubeconfig: {e}") from None
        self._api = kube.Cluster(api, timeout=REQUEST_SECONDS)

    def base(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            found: dict[str, Any] = self.request(
                "GET", kube.path(API_VERSION, PLURAL, namespace, name)
            )
        except kube.ApiError as e:
            raise _refusal(e, f'no knowledge base "{name}" in namespace "{namespace}"') from None
        return found

    def bases(self, namespace: str | None) -> list[dict[str, Any]]:
        try:
            found = self.request("GET", kube.path(API_VERSION, PLURAL, namespace))
        except kube.ApiError as e:
            raise _refusal(
                e, "the KnowledgeBase resource is not installed (kubectl apply -k crds/)"
            ) from None
        return sorted(
            found["items"], key=lambda b: (b["metadata"]["namespace"], b["metadata"]["name"])
        )

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        query = {"fieldSelector": f"involvedObject.name={name},involvedObject.kind={KIND}"}
        try:
            found = self.request("GET", kube.path("v1", "events", namespace), query=query)
        except kube.ApiError as e:
            if e.status == 403:
                return []  # a user who may not read Events still gets the rest
            raise PluginError(f"cannot list the Events of {name}: {_api_message(e)}") from None
        return list(found.get("items") or [])

    def annotate(self, namespace: str, name: str, key: str, value: str) -> None:
        self.base(namespace, name)  # names a missing base before a patch would
        try:
            self.request(
                "PATCH",
                kube.path(API_VERSION, PLURAL, namespace, name),
                body={"metadata": {"annotations": {key: value}}},
                content_type="application/merge-patch+json",
            )
        except kube.ApiError as e:
            raise _refusal(e, f'no knowledge base "{name}" in namespace "{namespace}"') from None

    def backups(self, namespace: str, base: str | None) -> list[dict[str, Any]]:
        try:
            found = self.request("GET", backup_path(namespace))
        except kube.ApiError as e:
            raise _refusal(
                e, "the KnowledgeBaseBackup resource is not installed (kubectl apply -k crds/)"
            ) from None
        items = list(found.get("items") or [])
        return [
            b for b in items if base is None or (b.get("spec") or {}).get("knowledge_base") == base
        ]

    def backup(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            found: dict[str, Any] = self.request("GET", backup_path(namespace, name))
        except kube.ApiError as e:
            raise _refusal(e, f'no backup "{name}" in namespace "{namespace}"') from None
        return found

    def create(self, obj: Mapping[str, Any]) -> None:
        """`obj` made in its namespace; one of its name already there is not replaced."""
        kind, meta = obj["kind"], obj["metadata"]
        plural = BACKUP_PLURAL if kind != KIND else PLURAL
        try:
            self.request("POST", kube.path(API_VERSION, plural, meta["namespace"]), body=obj)
        except kube.ApiError as e:
            if e.status == 409:
                raise PluginError(
                    f'a {kind} named "{meta["name"]}" exists in namespace "{meta["namespace"]}" '
                    "already: name another"
                ) from None
            raise PluginError(f"cannot create {kind} {meta['name']}: {_api_message(e)}") from None

    def token(self, namespace: str, name: str) -> str | None:
        """The base's token, from its Secret; None where the base has none."""
        try:
            secret = self.request("GET", kube.path("v1", "secrets", namespace, f"metis-{name}"))
        except kube.ApiError as e:
            if e.status == 404:
                return None
            raise PluginError(
                f"cannot read secret metis-{name}, which holds the token that writing the "
                f"base's notes needs: {_api_message(e)}"
            ) from None
        given = (secret.get("data") or {}).get("token")
        return base64.b64decode(given).decode() if given else None

    def indexer(
        self,
        base: Mapping[str, Any],
        method: str,
        route: str,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, str | int] | None = None,
        token: str | None = None,
    ) -> Any:
        """`route` of the base's indexer, through the API server's service proxy; `token`:
        the base's, for a route that writes."""
        ns, name = base["metadata"]["namespace"], base["metadata"]["name"]
        path = f"/api/v1/namespaces/{ns}/services/http:{child_name(name)}:http/proxy{route}"
        headers = {TOKEN_HEADER: token} if token else None
        try:
            return self.request(method, path, body=body, query=query, headers=headers)
        except kube.ApiError as e:
            own = indexer_error(name, e.body)
            if own is not None:
                raise PluginError(own) from None
            if e.status == 403:
                raise PluginError(f"not allowed: {_api_message(e)}") from None
            service = self._service_exists(ns, name) if endpoints_missing(e) else None
            raise PluginError(proxy_failure(base, e, service)) from None

    def _service_exists(self, namespace: str, name: str) -> bool | None:
        """Whether the base's Service exists; None where this user may not read it."""
        try:
            self.request("GET", kube.path("v1", "services", namespace, child_name(name)))
        except kube.ApiError as e:
            return False if e.status == 404 else None
        return True

    def request(self, method: str, path: str, **kw: Any) -> Any:
        """One call with the kubeconfig's credentials: its JSON; non-2xx as kube.ApiError."""
        try:
            return self._api.request(method, path, **kw)
        except OSError as e:
            raise PluginError(f"cannot reach the API server: {e}") from None


def _api_message(e: kube.ApiError) -> str:
    if isinstance(e.body, dict) and e.body.get("message"):
        return str(e.body["message"])
    return f"HTTP {e.status}" + (f": {str(e.body).strip()[:200]}" if e.body else "")


def _refusal(e: kube.ApiError, missing: str) -> PluginError:
    if e.status == 404:
        return PluginError(missing)
    if e.status in (401, 403):
        return PluginError(f"not allowed: {_api_message(e)}")
    return PluginError(_api_message(e))


class Ask(Protocol):
    """One call to a base's indexer, whichever way it is reached."""

    def __call__(
        self,
        method: str,
        route: str,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, str | int] | None = None,
        token: str | None = None,
    ) -> Any: ...


def direct(
    url: str,
    name: str,
    method: str,
    route: str,
    body: Mapping[str, Any] | None = None,
    query: Mapping[str, str | int] | None = None,
    token: str | None = None,
) -> Any:
    """`route` of the indexer at `url` (`--url`): where the API server's proxy cannot reach
    it, a port-forward's local port or a Service this machine reaches itself."""
    target = url.rstrip("/") + route
    headers = {TOKEN_HEADER: token} if token else None
    try:
        answer = httpx.request(
            method, target, json=body, params=query, headers=headers, timeout=REQUEST_SECONDS
        )
    except httpx.HTTPError as e:
        raise PluginError(
            f"cannot reach the indexer of {name} at {url}: {e} (is the port-forward running?)"
        ) from None
    try:
        data = answer.json()
    except ValueError:
        raise PluginError(
            f"{target} answered HTTP {answer.status_code}, not JSON: is {url} the indexer of "
            f"{name}?"
        ) from None
    if answer.is_error:
        raise PluginError(
            indexer_error(name, data) or f"{target} answered HTTP {answer.status_code}"
        ) from None
    return data


# --------------------------------------------------------------------------- commands


def _common(suppress: bool) -> argparse.ArgumentParser:
    """kubectl's flags, accepted before and after the command. After it they default to
    SUPPRESS, or a subcommand's defaults would undo `kubectl metis -n ns status`."""
    default: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
    c = argparse.ArgumentParser(add_help=False)
    c.add_argument("-n", "--namespace", help="the namespace (default: the context's)", **default)
    c.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="every namespace (status without a base)",
        **default,
    )
    c.add_argument("--context", help="the kubeconfig context to use", **default)
    c.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG)", **default)
    return c


def _reach() -> argparse.ArgumentParser:
    """`--url`, for the commands that ask a base's indexer."""
    r = argparse.ArgumentParser(add_help=False)
    r.add_argument(
        "--url",
        help="ask the base's indexer at URL, not through the API server's service proxy: "
        "http://127.0.0.1:7700 after kubectl port-forward -n NS svc/metis-BASE 7700, or "
        "without one on metis-dev's stand-in cluster, where a Service is a loopback port",
    )
    return r


def build_parser() -> argparse.ArgumentParser:
    common, reach = _common(suppress=True), _reach()
    p = argparse.ArgumentParser(
        prog="kubectl metis",
        parents=[_common(suppress=False)],
        description="Metis knowledge bases from kubectl",
        epilog="search, documents and note ask the base's indexer through the API server's "
        "service proxy (the services/proxy right in the namespace). The proxy routes by the "
        "Service's Endpoints and connects to the pod's address from the API server's host; "
        "where it cannot, the error says what failed, and --url asks the indexer through a "
        "port-forward instead.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("status", parents=[common], help="a base's state, index and evaluation")
    s.add_argument("base", nargs="?")
    q = sub.add_parser("search", parents=[common, reach], help="ask a base a question")
    q.add_argument("base")
    q.add_argument("question")
    q.add_argument("--mode", choices=get_args(schema.Mode), default="hybrid")
    q.add_argument("--top-k", type=int, default=5)
    q.add_argument("--no-rerank", action="store_true")
    q.add_argument("--json", action="store_true", help="print the answer as JSON")
    d = sub.add_parser("documents", parents=[common, reach], help="a base's documents")
    d.add_argument("base")
    d.add_argument("--failed", action="store_true", help="only those that failed, with why")
    r = sub.add_parser("reindex", parents=[common], help="ask a base for a pass now")
    r.add_argument("base")
    r.add_argument("--full", action="store_true", help="read every document again")
    e = sub.add_parser("evaluate", parents=[common], help="run a base's evaluation set")
    e.add_argument("base")
    e.add_argument("--k", type=int, default=10)
    n = sub.add_parser("note", parents=[common], help="a base's own notes: add, list, rm")
    notes = n.add_subparsers(dest="note", required=True)
    add = notes.add_parser("add", parents=[common, reach], help="keep a note, searchable at once")
    add.add_argument("base")
    add.add_argument("text")
    add.add_argument("--title")
    add.add_argument("--replaces", action="append", default=[], metavar="ID")
    add.add_argument("--id", help="the note's id (a note of that id is written over)")
    listed = notes.add_parser("list", parents=[common, reach], help="the notes, newest first")
    listed.add_argument("base")
    rm = notes.add_parser("rm", parents=[common, reach], help="forget a note")
    rm.add_argument("base")
    rm.add_argument("id")
    for each in (add, listed, rm):
        each.add_argument("--json", action="store_true", help="print the answer as JSON")
    b = sub.add_parser("backup", parents=[common], help="back a base up (a KnowledgeBaseBackup)")
    b.add_argument("base")
    b.add_argument("--name", help="the backup's name (default: BASE-YYYYMMDDhhmmss)")
    b.add_argument("--wait", action="store_true", help="until it completes or fails")
    bs = sub.add_parser("backups", parents=[common], help="the backups, newest first")
    bs.add_argument("base", nargs="?")
    rs = sub.add_parser("restore", parents=[common], help="a new base from a backup")
    rs.add_argument("new_base", metavar="NEW_BASE")
    rs.add_argument("--from", dest="from_backup", required=True, metavar="BACKUP")
    rs.add_argument(
        "-f",
        "--filename",
        help="the new base's manifest (default: the spec of the base backed up)",
    )
    rs.add_argument(
        "--dry-run", action="store_true", help="print the new base's manifest, make nothing"
    )
    return p


def run(args: argparse.Namespace, now: dt.datetime) -> str:
    cluster = Cluster(args.kubeconfig, args.context)
    ns = args.namespace or cluster.default_namespace
    if args.command == "status":
        if args.base is None:
            everywhere = args.all_namespaces
            return render_list(cluster.bases(None if everywhere else ns), now, all_ns=everywhere)
        return render_status(cluster.base(ns, args.base), cluster.events(ns, args.base), now)
    if args.command in ("reindex", "evaluate"):
        stamp = int(now.timestamp())
        if args.command == "reindex":
            key, value = REINDEX, reindex_value(args.full, stamp)
        else:
            key, value = EVALUATE, evaluate_value(args.k, stamp)
        cluster.annotate(ns, args.base, key, value)
        return f"knowledgebase.{GROUP}/{args.base} annotated {key}={value}"
    if args.command in ("backup", "backups", "restore"):
        return _backups(cluster, ns, args, now)
    base = cluster.base(ns, args.base)
    ask: Ask = (
        functools.partial(direct, args.url, args.base)
        if args.url
        else functools.partial(cluster.indexer, base)
    )
    if args.command == "note":
        answer = _note(cluster, base, ask, args)
        return json.dumps(answer, indent=2, ensure_ascii=False) if args.json else notes_text(answer)
    if args.command == "documents":
        query: dict[str, str | int] = {"page_size": schema.PAGE_SIZE_MAX}
        query |= {"state": "failed"} if args.failed else {}
        page = ask("GET", "/v1/documents", query=query)
        return render_documents(schema.DocumentsPage.model_validate(page))
    request = schema.SearchRequest(
        query=args.question,
        top_k=args.top_k,
        mode=args.mode,
        rerank=False if args.no_rerank else None,
    )
    answer = ask("POST", "/v1/search", request.model_dump(exclude_none=True))
    if args.json:
        return json.dumps(answer, indent=2, ensure_ascii=False)
    return answer_text(schema.SearchAnswer.model_validate(answer))


def _backups(cluster: Cluster, ns: str, args: argparse.Namespace, now: dt.datetime) -> str:
    if args.command == "backups":
        return render_backups(cluster.backups(ns, args.base), now)
    try:
        if args.command == "restore":
            backup = cluster.backup(ns, args.from_backup)
            of = (backup.get("spec") or {}).get("knowledge_base")
            try:
                source = cluster.base(ns, of) if of else None
            except PluginError:
                source = None
            given = _manifest(args.filename) if args.filename else None
            made = plugin_backups.restored_base(args.new_base, ns, backup, source, given)
            if args.dry_run:
                return str(yaml.safe_dump(made, sort_keys=False)).rstrip()
            cluster.create(made)
            return f"knowledgebase.{GROUP}/{args.new_base} created from backup {args.from_backup}"
        name = args.name or stamped(args.base, now)
        cluster.create(plugin_backups.backup_object(cluster.base(ns, args.base), name))
    except plugin_backups.BackupRefused as e:
        raise PluginError(str(e)) from None
    created = f"knowledgebasebackup.{GROUP}/{name} created"
    if not args.wait:
        return created
    print(created, flush=True)
    while (done := plugin_backups.finished(cluster.backup(ns, name))) is None:
        time.sleep(WAIT_SECONDS)
    if done.phase == "Failed":
        raise PluginError(plugin_backups.said(name, done))
    return plugin_backups.said(name, done)


def _manifest(path: str) -> dict[str, Any]:
    """The KnowledgeBase manifest in `path` (`-` for standard input)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        doc = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as e:
        raise PluginError(f"cannot read {path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise PluginError(f"{path} holds no {KIND} manifest")
    return doc


def _note(cluster: Cluster, base: Mapping[str, Any], ask: Ask, args: argparse.Namespace) -> Any:
    if args.note == "list":
        return ask("GET", "/v1/notes", query={"page_size": schema.PAGE_SIZE_MAX})
    token = cluster.token(base["metadata"]["namespace"], base["metadata"]["name"])
    if args.note == "rm":
        return ask("DELETE", f"/v1/notes/{args.id}", token=token)
    request = schema.NoteRequest(
        text=args.text, title=args.title, replaces=args.replaces, id=args.id
    )
    body = request.model_dump(exclude_none=True)
    return ask("POST", "/v1/notes", body, token=token)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = run(args, dt.datetime.fromtimestamp(time.time(), dt.UTC))
    except PluginError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if out:
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
