"""The operator's calls to a base's indexer: its status, and the requests a user makes
by annotation (reindex, evaluate). The answers are the indexer's own models
(`metis_indexer.schema`), so the two sides cannot drift apart."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import httpx

from metis_indexer.models import clients
from metis_indexer.schema import Backup, StatusAnswer
from metis_operator import cache, children, kube
from metis_operator.context import Context

log = logging.getLogger("metis_operator")


class IndexerError(Exception):
    """The indexer did not do what was asked; `temporary` says whether asking again helps."""

    def __init__(self, message: str, *, temporary: bool) -> None:
        super().__init__(message)
        self.temporary = temporary


def url(ctx: Context, owner: children.Owner) -> str:
    return ctx.settings.url(owner.child, owner.namespace, ctx.settings.indexer.port)


STOPPING_TRIES = 5
"""How often a status poll asks again while only a stopping pod answers it."""
STOPPING_PAUSE = 0.5
"""Seconds between those tries: kube-proxy learns a pod is going away a moment late."""


async def status(
    ctx: Context, owner: children.Owner, *, replaced: bool = False
) -> tuple[StatusAnswer | None, str | None]:
    """The indexer's `GET /v1/status`, or why it did not answer. `replaced`: the base's
    newest pod is ready beside one going away, so an answer from a stopping indexer is the
    old pod's (its Service still routes to it a moment): ask again, and never read the
    old pod's generation as the base's."""
    for attempt in range(STOPPING_TRIES):
        if attempt:
            await asyncio.sleep(STOPPING_PAUSE)
        answer, error = await _status(ctx, owner)
        if answer is None or not (replaced and answer.stopping):
            return answer, error
    return None, (
        f"only its stopping pod answered through its Service ({STOPPING_TRIES} tries): "
        "the Service does not reach its replacement yet"
    )


async def _status(ctx: Context, owner: children.Owner) -> tuple[StatusAnswer | None, str | None]:
    try:
        answer = await ctx.http.get(f"{url(ctx, owner)}/v1/status")
        answer.raise_for_status()
        return StatusAnswer.read(answer.json()), None
    except httpx.HTTPStatusError as e:
        return None, f"GET /v1/status answered HTTP {e.response.status_code}"
    except (httpx.HTTPError, ValueError) as e:
        return None, clients.describe(e)


async def token(ctx: Context, owner: children.Owner) -> str | None:
    """The base's API token (Secret `metis-<name>`, key `token`), None without one or
    without the right to read it (the indexer then answers 401, which says so)."""
    try:
        secret = await ctx.cluster.get(kube.path("v1", "secrets", owner.namespace, owner.child))
    except kube.ApiError as e:
        if e.status != 403:
            raise
        where = f"{owner.namespace}/{owner.name}"
        log.warning(
            "%s: cannot read Secret %s: %s", where, owner.child, e.message, extra={"base": where}
        )
        return None
    return cache.token(secret) if secret is not None else None


async def ask(
    ctx: Context, owner: children.Owner, route: str, body: Mapping[str, Any], timeout: float
) -> Any:
    where = f"{url(ctx, owner)}{route}"
    secret = await token(ctx, owner)
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    try:
        answer = await ctx.http.post(where, json=dict(body), timeout=timeout, headers=headers)
    except httpx.HTTPError as e:
        raise IndexerError(
            f"its indexer does not answer: {clients.describe(e)}", temporary=True
        ) from None
    if answer.is_success:
        return answer.json()
    try:
        error = answer.json()["error"]
        message = f"{error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {answer.status_code}"
    # 409: a replacement is taking over (STANDBY); 5xx: not serving yet. Else: never.
    raise IndexerError(message, temporary=answer.status_code == 409 or answer.status_code >= 500)


async def reindex(ctx: Context, owner: children.Owner, *, full: bool) -> None:
    """Ask the indexer for a pass now (`full`: read every document again)."""
    await ask(ctx, owner, "/v1/reindex", {"full": full}, ctx.settings.reach.timeout_seconds)


async def evaluate(ctx: Context, owner: children.Owner, *, k: int) -> dict[str, Any]:
    """Run the evaluation set; the figures the status keeps (never a miss: misses
    name documents)."""
    result = await ask(
        ctx, owner, "/v1/evaluate", {"k": k}, ctx.settings.reach.evaluate_timeout_seconds
    )
    return {key: result[key] for key in ("k", "cases", "recall_at_k", "mrr", "at")}


class BackupRefused(IndexerError):
    """The indexer answered a backup request with an error of its own: `code` is its
    code (NO_BACKUP_STORE, BACKUP_RUNNING, BACKUP_EXISTS, BACKUP_NOT_FOUND)."""

    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(f"{code}: {message}", temporary=status == 409 or status >= 500)
        self.code = code
        self.status = status


async def _backups(
    ctx: Context, owner: children.Owner, method: str, route: str, body: Any = None
) -> httpx.Response:
    """One call of the backups routes, with the base's token; BackupRefused for an error
    the indexer said, IndexerError (temporary) when it does not answer."""
    secret = await token(ctx, owner)
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    try:
        answer = await ctx.http.request(
            method, f"{url(ctx, owner)}{route}", json=body, headers=headers
        )
    except httpx.HTTPError as e:
        raise IndexerError(
            f"its indexer does not answer: {clients.describe(e)}", temporary=True
        ) from None
    if answer.is_success:
        return answer
    try:
        error = answer.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = f"HTTP_{answer.status_code}", answer.text[:200]
    raise BackupRefused(code, message, answer.status_code)


async def start_backup(ctx: Context, owner: children.Owner, name: str) -> Backup:
    """`POST /v1/backups`: the indexer starts backup `name` to its object store."""
    answer = await _backups(ctx, owner, "POST", "/v1/backups", {"name": name})
    return Backup.model_validate(answer.json())


async def backup(ctx: Context, owner: children.Owner, name: str) -> Backup:
    """`GET /v1/backups/{name}`: where backup `name` stands."""
    answer = await _backups(ctx, owner, "GET", f"/v1/backups/{name}")
    return Backup.model_validate(answer.json())


async def delete_backup(ctx: Context, owner: children.Owner, name: str) -> None:
    """`DELETE /v1/backups/{name}`: its objects deleted from the object store."""
    await _backups(ctx, owner, "DELETE", f"/v1/backups/{name}")
