"""One prober per model Service and role, shared by every base that names it.

Each interval a prober makes the cheap call (`GET /v1/models`, TEI's `GET /info`:
what does it serve?); the real call (an embedding or a rerank of two words) only
when the model it serves changed or after a failure. A Service counts as not
answering only once its failures span `grace` seconds (or it never answered this
prober): one slow answer never flips a base. Which answer a base sees is the pure
`verdict`; the loop around it is I/O.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable

import httpx

from metis_indexer.models import clients
from metis_operator import probes
from metis_operator.state import Model

log = logging.getLogger("metis_operator.prober")

Result = tuple[Model, str]
EMBEDDING_ROLE, RERANKER_ROLE = "embedding model", "reranker"
"""What a model Service is checked as (and named in messages as)."""


@dataclasses.dataclass(frozen=True)
class History:
    """What a prober knows: its last good answer, and since when calls fail."""

    good: Result | None = None
    """The last answer of a call that got through (Available or ServesSomethingElse)."""
    model_id: str | None = None
    """The model the Service served at the last real call."""
    failing_since: float | None = None
    failure: str = ""
    odd_since: float | None = None
    """Since when it serves something else while its last good answer said otherwise (or
    it had none): believed only once that spans the grace too. A new Service's address
    may still lead, for a moment, to whatever had it before (a reused cluster IP, a
    proxy's rules not yet rewritten): one odd answer never fails a base."""


def verdict(h: History, now: float, grace: float) -> Result | None:
    """What bases see: the last good answer until failures span `grace`; None before
    the first call finished."""
    if h.failing_since is None:
        return h.good
    if h.good is not None and now - h.failing_since < grace:
        return h.good
    return Model.NOT_ANSWERING, h.failure


def after_success(h: History, result: Result, model_id: str | None) -> History:
    return History(good=result, model_id=model_id)


def after_failure(h: History, detail: str, now: float) -> History:
    since = h.failing_since if h.failing_since is not None else now
    return dataclasses.replace(h, failing_since=since, failure=detail)


def needs_real_call(h: History, model_id: str | None) -> bool:
    """The real call only for a new model, after a failure, or before any answer."""
    return h.good is None or h.failing_since is not None or model_id != h.model_id


Probe = Callable[[httpx.AsyncClient, str], Awaitable[Result]]


class Prober:
    """One Service and role. `users` are the bases naming it; `on_change` wakes them."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        url: str,
        role: str,
        *,
        interval: float,
        grace: float,
        on_change: Callable[[], None],
        name: str,
    ) -> None:
        self.http, self.url, self.role, self.name = http, url, role, name
        self.interval, self.grace = interval, grace
        self.history = History()
        self.on_change = on_change
        self.calls = 0
        self._first = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"prober {self.name}")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def result(self) -> Result:
        """What bases see; waits for the first call to finish."""
        await self._first.wait()
        found = verdict(self.history, time.monotonic(), self.grace)
        assert found is not None  # the first call finished
        return found

    async def _loop(self) -> None:
        # The verdict its bases were last woken for, not the one before this probe: the
        # grace ends between two probes, so the verdict turns while the loop sleeps.
        said: Result | None = None
        while True:
            try:
                await self.probe_once()
            except Exception as e:  # a prober that died would leave its bases waiting
                log.exception("probing %s %s failed", self.role, self.name)
                self._failed(f"the probe failed: {e!r}", time.monotonic())
            self._first.set()
            after = verdict(self.history, time.monotonic(), self.grace)
            if after != said:
                said = after
                self.on_change()
            failing = self.history.failing_since is not None
            await asyncio.sleep(min(self.interval, 2.0) if failing else self.interval)

    async def probe_once(self) -> None:
        """The cheap call; the real one when `needs_real_call` says so."""
        now = time.monotonic()
        self.calls += 1
        try:
            info = await clients.discover(self.http, self.url)
            model_id: str | None = info.id
        except clients.ModelUnavailable as e:
            model_id = None
            cheap_failure = str(e)
        else:
            cheap_failure = ""
        if model_id is not None and not needs_real_call(self.history, model_id):
            self.history = after_success(self.history, self.history.good, model_id)  # type: ignore[arg-type]
            return
        if model_id is None and self.history.good is not None:
            # It answered before: a failed cheap call is a failure, not a change of role.
            self._failed(cheap_failure, now)
            return
        self.calls += 1
        probe: Probe = probes.embedding if self.role == EMBEDDING_ROLE else probes.reranker
        model, detail = await probe(self.http, self.url)
        if model is Model.NOT_ANSWERING:
            self._failed(detail or cheap_failure, now)
            return
        good = self.history.good
        if model is Model.SERVES_ELSE and (good is None or good[0] is not Model.SERVES_ELSE):
            since = self.history.odd_since if self.history.odd_since is not None else now
            if now - since < self.grace:
                self._failed(detail, now)
                self.history = dataclasses.replace(self.history, odd_since=since)
                return
        if self.history.failing_since is not None:
            log.info("%s %s answers again", self.role, self.name, extra={"service": self.name})
        self.history = after_success(self.history, (model, detail), model_id)

    def _failed(self, detail: str, now: float) -> None:
        if self.history.failing_since is None:
            log.warning(
                "%s %s does not answer: %s",
                self.role,
                self.name,
                detail,
                extra={"service": self.name, "role": self.role},
            )
        self.history = after_failure(self.history, detail, now)


class Probers:
    """Every prober, by (namespace, Service, role); a prober no base names is stopped."""

    def __init__(self, http: httpx.AsyncClient, *, interval: float, grace: float) -> None:
        self.http, self.interval, self.grace = http, interval, grace
        self._probers: dict[tuple[str, str, str], Prober] = {}
        self._users: dict[tuple[str, str, str], set[tuple[str, str]]] = {}
        self.wake: Callable[[set[tuple[str, str]]], None] = lambda bases: None

    def get(self, key: tuple[str, str, str], url: str, user: tuple[str, str]) -> Prober:
        prober = self._probers.get(key)
        if prober is not None and prober.url != url:
            self._drop(key)
            prober = None
        if prober is None:
            users = self._users.setdefault(key, set())
            prober = Prober(
                self.http,
                url,
                key[2],
                interval=self.interval,
                grace=self.grace,
                on_change=lambda: self.wake(set(users)),
                name=f"{key[0]}/{key[1]}",
            )
            self._probers[key] = prober
            prober.start()
        self._users.setdefault(key, set()).add(user)
        return prober

    def release(self, user: tuple[str, str], keep: set[tuple[str, str, str]]) -> None:
        """`user` now names only the probers `keep`; stop those no base names."""
        for key, users in list(self._users.items()):
            if key not in keep:
                users.discard(user)
            if not users:
                self._drop(key)

    def _drop(self, key: tuple[str, str, str]) -> None:
        prober = self._probers.pop(key, None)
        if prober is not None:
            prober.stop()
        self._users.pop(key, None)

    def calls(self) -> dict[str, int]:
        return {f"{k[0]}/{k[1]} {k[2]}": p.calls for k, p in self._probers.items()}
