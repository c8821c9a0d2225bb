"""How the operator says what it does: log lines (text, or one JSON object a line)
naming the base, and Kubernetes Events from component `metis-operator` with a real
action. `event` composes an Event as plain data; posting it is the caller's I/O.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

COMPONENT = "metis-operator"
log = logging.getLogger("metis_operator")

_FIELDS = ("base", "state", "child", "action", "service", "role", "request")
"""The `extra=` fields a JSON line carries when a log call sets them."""


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message and the fields set."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update({k: getattr(record, k) for k in _FIELDS if hasattr(record, k)})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def about(key: tuple[str, str], **fields: str) -> dict[str, str]:
    """The `extra=` of a line about the base `key` (namespace, name)."""
    return {"base": f"{key[0]}/{key[1]}", **fields}


def say(key: tuple[str, str], message: str, **fields: str) -> None:
    """A line about the base `key`: `namespace/name: message`."""
    log.info("%s/%s: %s", key[0], key[1], message, extra=about(key, **fields))


def configure_logging(fmt: str) -> None:
    """Root logging in `fmt` (text or json), with kopf's and httpx's chatter quiet:
    every request and every handler run would be a line."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    for chatty in ("httpx", "kopf.objects", "aiohttp.access", "kopf.activities"):
        logging.getLogger(chatty).setLevel(logging.WARNING)


def instance() -> str:
    """This replica: the pod's name, else the host's."""
    return os.environ.get("POD_NAME") or socket.gethostname()


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event(
    body: Mapping[str, Any], *, kind: str, reason: str, action: str, message: str, now: str = ""
) -> dict[str, Any]:
    """A core/v1 Event about the base `body`, reported by `metis-operator`."""
    meta = body["metadata"]
    stamp = now or _now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": body.get("apiVersion", ""),
            "kind": body.get("kind", ""),
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid", ""),
        },
        "type": kind,
        "reason": reason,
        "action": action,
        "message": message[:1024],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance()[:128],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
