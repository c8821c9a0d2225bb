"""A new chunking's index built beside the one that answers.

Chunks of another size are other passages: they cannot be switched chunk by chunk as a new
model's vectors are (`restage`). So the whole index is built again in a folder of its own
(`index.folders`), by a pass over the sources, while searches go on answering from the
index as it was, by meaning; once it is complete it answers instead, at once. A passage the
old index already holds keeps its vector (a short document, a section shorter than either
size, is cut the same), so the model is sent only what is new. A kill mid-build resumes
it: the files already built are not read again.
"""

from __future__ import annotations

import dataclasses
import math

from metis_indexer.index.memory import Index, IndexSettings
from metis_indexer.restage import LOG_MEGABYTES

ROUNDS = 3
"""Passes over the sources a build makes at most before it answers: the first reads every
document; each next one what changed meanwhile, until one finds nothing to read."""


@dataclasses.dataclass(slots=True)
class Building:
    """An index of a new chunking being built beside the one that answers."""

    old: IndexSettings
    new: IndexSettings
    index: Index
    """The new index (in its own folder): searches do not see it until it answers."""


class NoRoom(Exception):
    """The new chunking's index does not fit on the index drive beside the one that
    answers: the change waits for room, and the old index goes on answering."""


class BuildDamaged(Exception):
    """The index being built beside was damaged: it is removed and built again, while the
    one that answers goes on answering (it is not rebuilt: the damage is not its)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(
            f"the index being built beside the one that answers was damaged ({error}): it "
            "is built again"
        )


def needs_building(current: IndexSettings | None, wanted: IndexSettings, chunks: int) -> bool:
    """Whether a change is built beside the index that answers: the chunking changed, the
    model did not (a new model's vectors are made first, `restage`), and the index holds
    chunks to answer with meanwhile."""
    return (
        current is not None
        and chunks > 0
        and current.same_model(wanted)
        and chunking(current) != chunking(wanted)
    )


def chunking(settings: IndexSettings) -> tuple[int, int]:
    return settings.chunk_size, settings.chunk_overlap


def megabytes(
    answering_bytes: int, built_bytes: int, old: IndexSettings, new: IndexSettings
) -> int:
    """What the rest of a build costs on the index drive, in MB (rounded up): the answering
    index's size scaled by how many more chunks (a vector and a row each) or how much more
    text (the overlaps, stored again in each chunk) the new chunking makes, less what is
    built already."""
    old_step = old.chunk_size - old.chunk_overlap
    new_step = new.chunk_size - new.chunk_overlap
    more_chunks = old_step / new_step
    more_text = (new.chunk_size / new_step) / (old.chunk_size / old_step)
    estimate = answering_bytes * max(1.0, more_chunks, more_text)
    return math.ceil(max(0.0, estimate - built_bytes) / 1_000_000)


def no_room(needed_mb: int, free_mb: int, old: IndexSettings, new: IndexSettings) -> str | None:
    """Why a build cannot go on (the reason its `waiting` shows), or None when it fits with
    the log's room to spare."""
    if needed_mb + LOG_MEGABYTES <= free_mb:
        return None
    return (
        f"the index of {described(new)} needs about {needed_mb} MB more beside the one that "
        f"answers and {free_mb} MB are free on the index drive: the index of {described(old)} "
        "goes on answering until there is room"
    )


def described(settings: IndexSettings) -> str:
    """Chunks as the status and the log name them."""
    return f"chunks of {settings.chunk_size} characters (overlap {settings.chunk_overlap})"


def reason(old: IndexSettings, new: IndexSettings) -> str:
    """What the phase says while the new index is built."""
    return (
        f"building the index of {described(new)} beside the one of {described(old)}, which "
        "answers searches until it is complete"
    )
