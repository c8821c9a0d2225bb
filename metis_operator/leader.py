"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection
does it: of several replicas, only the holder of the Lease runs the operator.

`decide` is the whole policy, a pure function: a Lease nobody holds, or whose record
has not changed for its duration as this replica observed it (its own clock, never
the holder's timestamps), may be taken; the holder renews. `Elector` does the I/O:
`acquire` blocks until this replica leads; a thread then renews every `renew`
seconds and, once it could not renew for a whole lease duration or finds another
holder, ends the process (controller-runtime's habit: a restarted replica stands
by, and no two replicas ever act at once). `release` gives the Lease up at a clean
exit, so a standby takes over at its next retry rather than after the duration.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import http.server
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from metis_operator import kube

log = logging.getLogger("metis_operator.leader")
NAME = "metis-operator"
LEASE_SECONDS = 15
RENEW_SECONDS = 10
RETRY_SECONDS = 2


class Action(enum.Enum):
    CREATE = "create"
    """No Lease yet: create it, held by this replica."""
    RENEW = "renew"
    """This replica holds it: write a new renewTime."""
    TAKE = "take"
    """Free, or expired as observed here: write this replica in."""
    WAIT = "wait"
    """Another replica holds it and renews it."""


@dataclasses.dataclass(frozen=True)
class Seen:
    """The Lease's record as last read, and when (this replica's monotonic clock) it
    last changed."""

    record: tuple[Any, ...]
    changed_at: float


def record(lease: Mapping[str, Any] | None) -> tuple[Any, ...]:
    spec = (lease or {}).get("spec") or {}
    return (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))


def observe(seen: Seen | None, lease: Mapping[str, Any] | None, now: float) -> Seen:
    """Remember when the record last changed."""
    rec = record(lease)
    if seen is not None and seen.record == rec:
        return seen
    return Seen(rec, now)


def decide(lease: Mapping[str, Any] | None, seen: Seen, me: str, now: float) -> Action:
    if lease is None:
        return Action.CREATE
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    if holder == me:
        return Action.RENEW
    duration = float(spec.get("leaseDurationSeconds") or LEASE_SECONDS)
    if not holder or now - seen.changed_at >= duration:
        return Action.TAKE
    return Action.WAIT


def micro(at: dt.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def written(
    lease: Mapping[str, Any] | None, action: Action, me: str, namespace: str, at: dt.datetime
) -> dict[str, Any]:
    """The Lease to write for `action`."""
    stamp = micro(at)
    spec = dict((lease or {}).get("spec") or {})
    if action is not Action.RENEW:
        spec["acquireTime"] = stamp
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (lease is not None)
    spec.update(holderIdentity=me, leaseDurationSeconds=LEASE_SECONDS, renewTime=stamp)
    meta: dict[str, Any] = {"name": NAME, "namespace": namespace}
    if lease is not None:
        meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}


class Elector:
    """This replica's side of the election."""

    def __init__(
        self,
        cluster: kube.Cluster,
        namespace: str,
        me: str,
        *,
        lost: Callable[[], None] = lambda: os._exit(1),
    ) -> None:
        self.cluster, self.namespace, self.me = cluster, namespace, me
        self.path = kube.path("coordination.k8s.io/v1", "leases", namespace, NAME)
        self.lost = lost
        self.seen: Seen | None = None
        self.renewed = 0.0
        self._stop = threading.Event()

    def _get(self) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.cluster.request("GET", self.path)
            return found
        except kube.ApiError as e:
            if e.status == 404:
                return None
            raise

    def try_once(self) -> bool:
        """One round: whether this replica holds the Lease afterwards."""
        lease = self._get()
        now = time.monotonic()
        self.seen = observe(self.seen, lease, now)
        action = decide(lease, self.seen, self.me, now)
        if action is Action.WAIT:
            return False
        body = written(lease, action, self.me, self.namespace, dt.datetime.now(dt.UTC))
        try:
            if action is Action.CREATE:
                self.cluster.request(
                    "POST",
                    self.path.rsplit("/", 1)[0],
                    body=body,
                    query={"fieldManager": self.cluster.manager},
                )
            else:
                self.cluster.request(
                    "PUT", self.path, body=body, query={"fieldManager": self.cluster.manager}
                )
        except kube.ApiError as e:
            if e.status == 409:  # another replica wrote first
                return False
            raise
        if action is not Action.RENEW:
            log.info("%s leads (Lease %s/%s)", self.me, self.namespace, NAME)
        self.renewed = time.monotonic()
        return True

    def acquire(self) -> None:
        """Block until this replica leads, then keep renewing in a thread."""
        log.info("%s stands by for Lease %s/%s", self.me, self.namespace, NAME)
        while not self._attempt():
            time.sleep(RETRY_SECONDS)
        threading.Thread(target=self._renew_loop, name="lease renewal", daemon=True).start()

    def _attempt(self) -> bool:
        try:
            return self.try_once()
        except (kube.ApiError, OSError) as e:
            log.warning("Lease %s/%s: %s", self.namespace, NAME, e)
            return False

    def _renew_loop(self) -> None:
        wait = RENEW_SECONDS
        while not self._stop.wait(wait):
            if self._attempt():
                wait = RENEW_SECONDS
                continue
            wait = RETRY_SECONDS
            holder = (self.seen.record[0] if self.seen else None) or "nobody"
            if holder != self.me or time.monotonic() - self.renewed >= LEASE_SECONDS:
                log.error("%s lost the Lease (held by %s): exiting", self.me, holder)
                self.lost()
                return

    def release(self) -> None:
        """Give the Lease up at a clean exit."""
        self._stop.set()
        try:
            lease = self._get()
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.me:
                return
            spec = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1}
            self.cluster.request(
                "PUT",
                self.path,
                body={**lease, "spec": spec},
                query={"fieldManager": self.cluster.manager},
            )
            log.info("%s released the Lease", self.me)
        except (kube.ApiError, OSError) as e:
            log.warning("cannot release the Lease: %s", e)


class StandbyHealth:
    """`/healthz` while standing by, so that a liveness probe does not restart a
    standby; closed before the operator serves its own on the same port."""

    def __init__(self, port: int) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/plain")
                self.end_headers()
                self.wfile.write(b"standing by\n")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
        threading.Thread(
            target=self.server.serve_forever, name="standby health", daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
