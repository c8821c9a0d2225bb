"""What a change asks of the pass it runs in: its read of the sources (`Read`) and the
progress it shows (`Shown`). The pass (`service.passes.Passes`) gives both; a change never
knows the pass itself."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from metis_indexer.index.memory import Index, IndexSettings
from metis_indexer.ingest import plan
from metis_indexer.ingest.runner import Embed, PassState


class Read(Protocol):
    """The pass's read: what changed in the sources read into `index` (the one that answers
    unless said), as `settings` say, its chunks embedded by `embed`, what is gone dropped."""

    def __call__(
        self, settings: IndexSettings, embed: Embed, index: Index | None = None
    ) -> Awaitable[plan.Plan]: ...


class Shown(Protocol):
    """The pass's progress (`service.progress.Progress`): its state, its phase, and how far a
    change is (`changing`, the reason the phases show meanwhile)."""

    changing: str

    @property
    def state(self) -> PassState: ...

    def set_phase(self, phase: str, reason: str) -> None: ...

    def publish(self) -> None: ...
