"""What a status shows of the passes, published as it changes: the phase and why, and the
pass's counts, to the metrics and to whoever follows the passes (`metis serve`'s bar)."""

from __future__ import annotations

from collections.abc import Callable

from metis_indexer.index.memory import Totals
from metis_indexer.ingest.runner import PassState
from metis_indexer.metrics import Metrics

OnProgress = Callable[[PassState], None]
"""Told of every change of the passes' state: a phase, a document done."""


class Progress:
    """The passes' state, and its publication; every part that changes the phase says so
    here."""

    def __init__(
        self, metrics: Metrics, totals: Callable[[], Totals], on_progress: OnProgress | None
    ) -> None:
        self.metrics = metrics
        self.state = PassState()
        self.rebuilding = ""
        """Why every document is being read again, until that pass is done: the reason a
        phase of the passes shows meanwhile."""
        self.changing = ""
        """How far a new embedding model's vectors are, while they are made: the reason
        the phases of the passes show meanwhile."""
        self._totals = totals
        """What the index holds now (a rebuild replaces the index)."""
        self._on_progress = on_progress
        metrics.set_phase("loading")

    def set_phase(self, phase: str, reason: str) -> None:
        if not reason and phase in ("loading", "scanning", "indexing"):
            reason = self.changing or self.rebuilding
        self.state.phase, self.state.reason = phase, reason
        self.metrics.set_phase(phase)
        self.publish()

    def publish(self) -> None:
        m, s = self.metrics, self.state
        m.pass_total.set(s.total)
        m.pass_done.set(s.done)
        totals = self._totals()
        m.documents.set(totals.documents)
        m.chunks.set(totals.chunks)
        m.failed.set(totals.failed)
        if self._on_progress is not None:
            self._on_progress(s)
