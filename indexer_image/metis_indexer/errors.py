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
     ├── TooLarge              413  INVALID_BODY (a body over its route's bound)
     ├── UnsupportedEncoding   415  ENCODING_UNSUPPORTED (a Content-Encoding not decoded here)
     ├── Unavailable           503  KNOWLEDGE_BASE_NOT_READY, EMBEDDING_MODEL_UNAVAILABLE
     ├── DriveFull             507  NOTES_DRIVE_FULL (a note that does not fit on the drive)
     └── Conflict              409  STANDBY, EVALUATION_RUNNING, NOTES_REPLICATED,
                                    NOTE_REPLACES_* (what the notes held refuse),
                                    NOTE_UNREADABLE (a note whose record cannot be read)
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


class TooLarge(Refusal):
    status = 413


class UnsupportedEncoding(Refusal):
    """A body in an encoding the server does not decode: read as it came, it would be
    taken for other words."""

    status = 415


class Unavailable(Refusal):
    status = 503


class DriveFull(Refusal):
    """The drive has no room for what the request would keep: nothing of it is kept, what
    was held before stays; the same request goes through once there is room."""

    status = 507


class Conflict(Refusal):
    status = 409
