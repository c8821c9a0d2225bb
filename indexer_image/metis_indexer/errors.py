"""The indexer's domain errors: each carries its API code and HTTP status.

The core raises these; the HTTP app's one middleware turns them into
`{"error": {"code", "message"}}` answers, with the error's headers.

    Refusal
     ├── BadRequest            400  the question, a body or a parameter refused
     ├── Unauthorized          401  a route that takes the operator's token, without it
     ├── NotFound              404  no such note, no such backup
     ├── TimedOut              408  a body that did not arrive whole in time
     ├── TooLarge              413  a body over its route's bound
     ├── UnsupportedEncoding   415  a Content-Encoding not decoded here
     ├── Unavailable           503  the index not loaded; the embedding model unavailable;
     │                              the backup store unreachable
     ├── DriveFull             507  a note that does not fit on the drive
     └── Conflict              409  what the indexer's state refuses (standby, an evaluation
                                    running, the notes held, a backup running or no
                                    backup store)

The codes each route answers, status by status, are declared with the route (api.ROUTES),
and so listed in the OpenAPI document.
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
