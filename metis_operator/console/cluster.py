"""What the console knows of the cluster: every KnowledgeBase it may see, their recent
Events and their backups, kept current by three watches (metis_operator/kube.py).

The client is synchronous, so each watch runs in a daemon thread: it lists, watches
from the list's resourceVersion, lists again when the watch ends or expires (410),
and backs off on errors, saying why on the Bases page. Every change is handed to the
event loop, which bumps `Cluster.version` and wakes the pages that stream updates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from metis_operator import kube
from metis_operator.api.identity import API_VERSION, BACKUP_PLURAL, KIND, PLURAL
from metis_operator.console.views import (
    BackupView,
    BaseView,
    EventView,
    backup_view,
    base_view,
    event_view,
)

log = logging.getLogger("metis.console")

EVENTS_KEPT = 20
"""Recent Events shown per base."""
WATCH_SECONDS = 60
"""How long one watch request runs before the list is read again."""
BACKOFF_SECONDS = (1, 2, 5, 10, 30)

Obj = dict[str, Any]


def _key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


class Cluster:
    """Bases and their Events as last seen; changed only on the event loop's thread."""

    def __init__(self) -> None:
        self.bases: dict[str, Obj] = {}
        self.events: dict[str, dict[str, Obj]] = {}
        """Per base key, its Events by uid."""
        self.backups: dict[str, Obj] = {}
        """Every KnowledgeBaseBackup, by its own key."""
        self.problems: dict[str, str] = {}
        """Per watch, why it cannot see the cluster now."""
        self.version = 0
        self.closing = False
        self._changed = asyncio.Event()

    def _bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self, seen: int, timeout: float) -> None:
        """Return when something changed after version `seen`, or after `timeout`."""
        if self.version != seen or self.closing:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    def close(self) -> None:
        self.closing = True
        self._bump()

    # What the watches report (called on the loop's thread).

    def listed_bases(self, items: list[Obj]) -> None:
        bases = {_key(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in items}
        if bases != self.bases:
            self.bases = bases
            self._bump()

    def base_event(self, kind: str, obj: Obj) -> None:
        key = _key(obj["metadata"]["namespace"], obj["metadata"]["name"])
        if kind == "DELETED":
            self.bases.pop(key, None)
        else:
            self.bases[key] = obj
        self._bump()

    def listed_events(self, items: list[Obj]) -> None:
        events: dict[str, dict[str, Obj]] = {}
        for o in items:
            events.setdefault(_about(o), {})[o["metadata"]["uid"]] = o
        if events != self.events:
            self.events = events
            self._bump()

    def event_event(self, kind: str, obj: Obj) -> None:
        those = self.events.setdefault(_about(obj), {})
        if kind == "DELETED":
            those.pop(obj["metadata"]["uid"], None)
        else:
            those[obj["metadata"]["uid"]] = obj
        self._bump()

    def listed_backups(self, items: list[Obj]) -> None:
        backups = {_key(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in items}
        if backups != self.backups:
            self.backups = backups
            self._bump()

    def backup_event(self, kind: str, obj: Obj) -> None:
        key = _key(obj["metadata"]["namespace"], obj["metadata"]["name"])
        if kind == "DELETED":
            self.backups.pop(key, None)
        else:
            self.backups[key] = obj
        self._bump()

    def problem(self, what: str, why: str | None) -> None:
        if self.problems.get(what) != why:
            if why is None:
                self.problems.pop(what, None)
            else:
                self.problems[what] = why
            self._bump()

    # What the pages read.

    def views(self) -> list[BaseView]:
        return [base_view(self.bases[k]) for k in sorted(self.bases)]

    def view(self, key: str) -> BaseView | None:
        obj = self.bases.get(key)
        if obj is None:
            return None
        return base_view(obj).model_copy(update={"backups": self.backups_of(key)})

    def backups_of(self, key: str) -> list[BackupView]:
        """The base's backups, newest first."""
        namespace, _, name = key.partition("/")
        mine = [
            backup_view(o)
            for k, o in self.backups.items()
            if k.partition("/")[0] == namespace
            and (o.get("spec") or {}).get("knowledge_base") == name
        ]
        return sorted(mine, key=lambda b: (b.created, b.name), reverse=True)

    def recent_events(self, key: str) -> list[EventView]:
        those = [event_view(o) for o in self.events.get(key, {}).values()]
        return sorted(those, key=lambda e: e.last, reverse=True)[:EVENTS_KEPT]

    def trouble(self) -> str | None:
        return "; ".join(self.problems.values()) or None


def _about(event: Obj) -> str:
    involved = event.get("involvedObject") or {}
    return _key(
        involved.get("namespace") or event["metadata"].get("namespace", ""),
        involved.get("name", ""),
    )


class Watches:
    """The three watch threads; `stop` ends them (each within one watch request)."""

    def __init__(
        self,
        api: kube.Cluster,
        cluster: Cluster,
        namespace: str | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []

        def on_loop(fn: Callable[..., None]) -> Callable[..., None]:
            def call(*a: Any) -> None:
                loop.call_soon_threadsafe(fn, *a)

            return call

        for what, url_path, query, listed, changed in (
            (
                "knowledgebases",
                kube.path(API_VERSION, PLURAL, namespace),
                {},
                cluster.listed_bases,
                cluster.base_event,
            ),
            (
                "events",
                kube.path("v1", "events", namespace),
                {"fieldSelector": f"involvedObject.kind={KIND}"},
                cluster.listed_events,
                cluster.event_event,
            ),
            (
                "knowledgebasebackups",
                kube.path(API_VERSION, BACKUP_PLURAL, namespace),
                {},
                cluster.listed_backups,
                cluster.backup_event,
            ),
        ):
            follow = _Follow(
                what,
                api,
                url_path,
                query,
                on_loop(listed),
                on_loop(changed),
                on_loop(cluster.problem),
                self.stopping,
            )
            self.threads.append(
                threading.Thread(target=follow.run, name=f"watch-{what}", daemon=True)
            )

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stopping.set()


class _Follow:
    """List, then watch, again and again, until stopped."""

    def __init__(
        self,
        what: str,
        api: kube.Cluster,
        url_path: str,
        query: dict[str, str],
        listed: Callable[..., None],
        changed: Callable[..., None],
        problem: Callable[..., None],
        stopping: threading.Event,
    ) -> None:
        self.what, self.api, self.url_path, self.query = what, api, url_path, query
        self.listed, self.changed, self.problem = listed, changed, problem
        self.stopping = stopping

    def run(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            try:
                self._once()
                failures = 0
            except kube.ApiError as e:
                if e.status == 410:
                    continue  # the watch's resourceVersion expired: list again at once
                failures += 1
                self._failed(f"{e.status} {e.reason}")
            except Exception as e:  # any failure of a watch: say it, back off, try again
                failures += 1
                self._failed(str(e) or type(e).__name__)
            if failures:
                self.stopping.wait(BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS)) - 1])

    def _failed(self, why: str) -> None:
        log.warning("cannot watch %s: %s", self.what, why)
        self.problem(self.what, f"cannot watch {self.what}: {why}")

    def _once(self) -> None:
        listed = self.api.request("GET", self.url_path, query=self.query)
        self.listed(listed.get("items") or [])
        self.problem(self.what, None)
        version = listed["metadata"]["resourceVersion"]
        with contextlib.closing(
            self.api.watch(self.url_path, version, WATCH_SECONDS, self.query)
        ) as changes:
            for kind, obj in changes:
                if self.stopping.is_set():
                    return
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.changed(kind, obj)
