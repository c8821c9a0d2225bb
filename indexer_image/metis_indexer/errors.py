"""The indexer's domain errors: each carries its API code and HTTP status.

The core raises these; the HTTP app's one middleware turns them into
`{"error": {"code", "message"}}` answers, with the error's headers.

    Refusal
     ├── BadRequest            400  QUERY_EMPTY, QUERY_TOO_LONG, TOP_K_OUT_OF_RANGE,
     │                              INVALID_BODY, NO_EMBEDDING_MODEL, EVAL_*,
     │                              NOTE_* (a note's body)
     ├── Unauthorized          401  UNAUTHORIZED (a costly route without the operator's token)
     ├── NotFound              404  NOTE_NOT_FOUND
     ├── TimedOut              408  REQUEST_TIMEOUT (a body that did not arrive whole in time)
     ├── Unavailable           503  KNOWLEDGE_BASE_NOT_READY, EMBEDDING_MODEL_UNAVAILABLE
     └── Conflict              409  STANDBY, EVALUATION_RUNNING, NOTES_REPLICATED,
                                    NOTE_REPLACES_* (what the notes held refuse)
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType


class Refusal(Exception):
    """An answer the API gives instead of a result (not the operator's `kube.ApiError`, an
    error of the Kubernetes API)."""

    status = 500
    headers: Mapping[str, str] = MappingProxyType({})

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class BadRequest(Refusal):
    status = 400


class Unauthorized(Refusal):
    """The route needs `Authorization: Bearer <token>`; the header says which scheme."""

    status = 401
    headers = MappingProxyType({"WWW-Authenticate": "Bearer"})


class NotFound(Refusal):
    status = 404


class TimedOut(Refusal):
    status = 408


class Unavailable(Refusal):
    status = 503


class Conflict(Refusal):
    status = 409
