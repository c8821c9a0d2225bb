"""How a parser's exception becomes the detail of a failed document."""

from __future__ import annotations

_LONGEST = 300
"""Characters kept: the reason a user reads in a document list, not a traceback."""


def detail(e: BaseException, context: str = "") -> str:
    """The exception's type and message, after `context` ("page 3"). An OS error says
    what happened without its file name: the pod's path means nothing to a user."""
    message = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
    text = f"{type(e).__name__}: {message}" if message else type(e).__name__
    if context:
        text = f"{context}: {text}"
    return text if len(text) <= _LONGEST else text[: _LONGEST - 1] + "…"
