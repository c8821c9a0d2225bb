"""A base's own notes (spec 002, "Memories"): the decisions, over plain data.

A note is a short text written over the API and kept on the base's own drive, indexed as
a document of the source `metis-<name>`. A note may name the notes it replaces; a note
is replaced while a note that names it exists (forgetting the newer one makes the older
hold again). After reranking, the results of notes that still hold come before those of
replaced ones, each group in its order, in the places the notes' results had among the
others: a document's result keeps its rank.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from metis_indexer.errors import BadRequest, Conflict

TEXT_MAX = 8000
"""Characters a note's text may have: a fact, a decision, a summary (a few chunks)."""
TITLE_MAX = 200
REPLACES_MAX = 16
"""Notes one note may replace."""
REPLACES_DEPTH_MAX = 1000
"""Replaced notes a chain of replacements may hold below a note: each link one version
of a fact, every version searchable. A thousand is a fact revised every working day for
four years; a history longer than that is better summarized in a note that replaces
none. The bound keeps the walk each write makes over the chain (under the write lock)
short."""
ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
"""A note's id, as written by its writer or made here: it names the note's file."""
_ID = re.compile(ID_PATTERN)
SUFFIX = ".md"
"""A note is kept as Markdown: its title as the first heading, then its text."""


@dataclasses.dataclass(frozen=True, slots=True)
class Note:
    id: str
    text: str
    written_at: str
    title: str | None = None
    replaces: tuple[str, ...] = ()

    @property
    def document(self) -> str:
        """The note's path in its source, as citations name it."""
        return self.id + SUFFIX


def written_now(latest: Iterable[str] = ()) -> str:
    """When a note is written, to the millisecond and after every note already held
    (`latest`): a note written in the same millisecond as another, or after the clock
    stepped back, is still the newer one."""
    now = dt.datetime.now(dt.UTC)
    at = now.replace(microsecond=now.microsecond // 1000 * 1000)
    held = [moment(w) for w in latest]
    if held and max(held) >= at:
        at = max(held) + dt.timedelta(milliseconds=1)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def moment(written_at: str) -> dt.datetime:
    """A note's `written_at` read back; ValueError for what no note's record holds."""
    at = dt.datetime.fromisoformat(written_at)
    if at.tzinfo is None:
        raise ValueError(f"written_at {written_at[:40]!r} names no time zone")
    return at


def source(base: str) -> str:
    """The source a base's notes are documents of."""
    return f"metis-{base}"


def folder(index_dir: Path) -> Path:
    """Where a base's notes are kept: a folder of its index drive, beside its indexes."""
    return index_dir / "notes"


def new_id() -> str:
    return secrets.token_hex(6)


def of_document(document: str) -> str | None:
    """The id of the note a document of the notes' source is; None for another file."""
    if not document.endswith(SUFFIX):
        return None
    found = document[: -len(SUFFIX)]
    return found if _ID.fullmatch(found) else None


def markdown(note: Note) -> str:
    """The note's file: what is indexed of it."""
    return f"# {note.title}\n\n{note.text}\n" if note.title else note.text + "\n"


def check_id(note_id: str) -> str:
    if not _ID.fullmatch(note_id):
        raise BadRequest(
            "NOTE_ID_INVALID",
            f"note id {note_id[:80]!r} is not one: 1 to 63 lowercase letters, digits and "
            "dashes, starting with a letter or digit",
        )
    return note_id


def check_write(
    text: str,
    title: str | None,
    replaces: Sequence[str],
    note_id: str,
    notes: Mapping[str, Note],
) -> tuple[str, str | None, tuple[str, ...]]:
    """The note's text, title and replaced ids as kept, or the refusal that names what
    is wrong: an empty or too long text or title, or an id that is not one (400); an
    unknown note to replace, a note replacing itself, a replacement that would close
    a cycle or make a chain longer than REPLACES_DEPTH_MAX (409: the body is well formed,
    the notes held refuse it)."""
    check_id(note_id)
    if len(text) > TEXT_MAX:
        raise BadRequest(
            "NOTE_TOO_LONG",
            f"the note's text has {len(text)} characters; at most {TEXT_MAX} are allowed",
        )
    text = text.strip()
    if not text:
        raise BadRequest("NOTE_EMPTY", "the note's text is empty")
    if title is not None and len(title) > TITLE_MAX:
        raise BadRequest(
            "NOTE_TOO_LONG",
            f"the note's title has {len(title)} characters; at most {TITLE_MAX} are allowed",
        )
    if title is not None:
        title = " ".join(title.split()) or None
    if len(replaces) > REPLACES_MAX:
        raise BadRequest(
            "NOTE_REPLACES_TOO_MANY",
            f"the note replaces {len(replaces)} notes; at most {REPLACES_MAX} are allowed",
        )
    for r in replaces:
        check_id(r)
    kept = tuple(dict.fromkeys(replaces))
    if note_id in kept:
        raise Conflict("NOTE_REPLACES_ITSELF", f"note {note_id} cannot replace itself")
    unknown = [r for r in kept if r not in notes]
    if unknown:
        raise Conflict(
            "NOTE_REPLACES_UNKNOWN",
            f"the note replaces {', '.join(unknown[:5])}, which the base does not hold",
        )
    cycle, deep = _walk(note_id, kept, notes)
    if cycle:
        raise Conflict(
            "NOTE_REPLACES_CYCLE",
            f"note {note_id} would replace a note that replaces it: {_named(cycle)}",
        )
    if deep > REPLACES_DEPTH_MAX:
        raise Conflict(
            "NOTE_REPLACES_TOO_DEEP",
            f"note {note_id} would end a chain of {deep} replaced notes; at most "
            f"{REPLACES_DEPTH_MAX} are allowed: write the fact as a note that replaces none "
            "and forget the oldest ones",
        )
    return text, title, kept


def _walk(
    note_id: str, replaces: Iterable[str], notes: Mapping[str, Note]
) -> tuple[list[str], int]:
    """The chain by which a note `note_id` replaces would come back to it (empty: none),
    and the longest chain of replaced notes below it. Depth first over what each note
    replaces, on a stack of its own rather than Python's (a chain of thousands of links
    is walked like one of three); each note held is walked once."""
    path = [note_id]
    pending = [iter(replaces)]
    below = [0]
    """The longest chain found below each note of `path`."""
    depth: dict[str, int] = {}
    while pending:
        r = next(pending[-1], None)
        if r is None:
            pending.pop()
            done, longest = path.pop(), below.pop()
            if not pending:
                return [], longest
            depth[done] = longest
            below[-1] = max(below[-1], longest + 1)
            continue
        if r == note_id:
            return [*path, r], 0
        if r in depth:
            below[-1] = max(below[-1], depth[r] + 1)
        elif r in notes and r not in path:  # a loop among the notes held is walked once
            path.append(r)
            pending.append(iter(notes[r].replaces))
            below.append(0)
    raise AssertionError("unreachable: the first frame returns")


def _named(chain: Sequence[str]) -> str:
    """A chain as a message names it: the whole of a short one, the ends of a long one."""
    if len(chain) <= 12:
        return " → ".join(chain)
    return " → ".join([*chain[:6], f"… ({len(chain) - 9} more)", *chain[-3:]])


@dataclasses.dataclass(frozen=True, slots=True)
class Replaced:
    """The newest note that replaces one, and when it was written."""

    by: str
    at: str


def replaced(notes: Iterable[Note]) -> dict[str, Replaced]:
    """Each replaced note's newest replacement (a replacement of a note no longer held
    counts for nothing)."""
    found: dict[str, Replaced] = {}
    for n in sorted(notes, key=lambda n: (moment(n.written_at), n.id)):
        for r in n.replaces:
            found[r] = Replaced(n.id, n.written_at)
    return found


def holding_first(is_replaced: Sequence[bool | None]) -> list[int]:
    """The order of results by their positions: each entry says whether the result is a
    replaced note (True), a note that holds (False) or another document (None). The places
    notes hold keep being notes', filled by the holding ones first, then the replaced
    ones, each group in its order; other documents keep their places."""
    holding = [i for i, r in enumerate(is_replaced) if r is False]
    old = [i for i, r in enumerate(is_replaced) if r is True]
    notes = iter(holding + old)
    return [i if r is None else next(notes) for i, r in enumerate(is_replaced)]
