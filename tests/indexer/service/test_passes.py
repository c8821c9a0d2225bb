"""The pass loop (`metis_indexer.service.passes`) over a real index and a real reader pool,
keyword-only (no model): a pass reads the sources, another runs when one is asked for,
damage met outside the loop rebuilds the index from the sources, damage met in an index
replaced since is only counted, and no pass is taken while a replacement takes over."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from metis_indexer import notes
from metis_indexer.config import IndexerConfig, SourceConfig
from metis_indexer.configured import Configured
from metis_indexer.errors import Conflict
from metis_indexer.index import store
from metis_indexer.index.memory import Index
from metis_indexer.ingest.readers.pool import ReaderPool
from metis_indexer.metrics import Metrics
from metis_indexer.service.model_watch import ModelWatch
from metis_indexer.service.passes import Passes
from metis_indexer.service.progress import Progress

DEADLINE = 60.0
"""Far past any pass over these few files."""
MALFORMED = sqlite3.DatabaseError("database disk image is malformed")


@dataclasses.dataclass
class Parts:
    passes: Passes
    progress: Progress
    metrics: Metrics
    drive: Path


def parts(tmp_path: Path) -> Parts:
    """The passes as `service.Indexer` wires them, over one source of one page, no model."""
    drive = tmp_path / "drive"
    drive.mkdir()
    (drive / "leave.md").write_text("# Leave\n\nTwenty-five vacation days a year.\n")
    config = IndexerConfig(
        name="team",
        sources=[SourceConfig(drive="docs", root=drive)],
        index_dir=tmp_path / "index",
        rescan_seconds=0,  # a pass only when one is asked for
        workers=1,
    )
    configured = Configured(config)
    metrics = Metrics.create()
    made: list[Passes] = []
    progress = Progress(metrics, lambda: made[0].index.totals(), None)
    made.append(Passes(configured, progress, ModelWatch(configured, progress), metrics))
    return Parts(made[0], progress, metrics, drive)


@contextlib.asynccontextmanager
async def looping(passes: Passes) -> AsyncIterator[None]:
    """The index loaded and the loop running, as the writing indexer runs them; then all
    let go, as `Indexer.stop` does."""
    assert await passes.open() is None
    passes.loaded = True
    pool = ReaderPool(1)
    loop = asyncio.create_task(passes.loop(pool), name="passes")
    try:
        yield
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
        await asyncio.to_thread(pool.close)
        await asyncio.to_thread(passes.index.writes_done)
        await passes.close()
        passes.index.store.close()


async def until(what: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not what():
        assert time.monotonic() < deadline, "not so within the deadline"
        await asyncio.sleep(0.02)


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def held(index: Index) -> set[str]:
    return {f.record.path for f in index.files.values()}


def test_a_pass_reads_the_sources_and_another_runs_when_asked_for(tmp_path: Path) -> None:
    p = parts(tmp_path)
    state = p.progress.state

    async def run() -> None:
        async with looping(p.passes):
            await until(lambda: state.completed == 1)
            assert held(p.passes.index) == {"leave.md"} and p.passes.passed
            assert (state.phase, state.read) == ("ready", 1)
            (p.drive / "travel.md").write_text("# Travel\n\nTrains rather than flights.\n")
            p.passes.request()
            await until(lambda: state.completed == 2)
            assert held(p.passes.index) == {"leave.md", "travel.md"}
            assert (state.total, state.read) == (1, 1)  # the page read before is not
            leave = p.drive / "leave.md"
            os.utime(leave, ns=(time.time_ns(), leave.stat().st_mtime_ns + 10**9))
            p.passes.request()
            await until(lambda: state.completed == 3)
            assert (state.total, state.read, state.unchanged) == (1, 0, 1)  # touched only
            p.passes.request(full=True)
            await until(lambda: state.completed == 4)
            assert (state.total, state.read, state.unchanged) == (2, 2, 0)  # all read again

    asyncio.run(run())


def test_damage_met_outside_the_loop_rebuilds_the_index_from_the_sources(tmp_path: Path) -> None:
    p = parts(tmp_path)
    state = p.progress.state

    async def run() -> None:
        async with looping(p.passes):
            await until(lambda: state.completed == 1)
            damaged = p.passes.index
            p.passes.damaged(MALFORMED, "search", damaged)
            assert p.passes.damage is not None and "met by a search" in p.passes.damage
            await until(lambda: state.completed == 2)
            assert p.passes.index is not damaged and p.passes.damage is None
            assert held(p.passes.index) == {"leave.md"}  # read again from the sources
            [note] = p.passes.notes
            assert "the index was damaged (database disk image is malformed)" in note
            aside = list((tmp_path / "index").glob(f"*{store.DAMAGED_SUFFIX}"))
            assert len(aside) == 1 and aside[0].name in note

    asyncio.run(run())
    assert sample(p.metrics, "metis_index_rebuilds_total") == 1
    assert sample(p.metrics, "metis_index_damage_found_total", found_by="search") == 1


def test_damage_met_in_an_index_replaced_since_is_only_counted(tmp_path: Path) -> None:
    p = parts(tmp_path)
    replaced = Index(tmp_path / "replaced")
    try:
        p.passes.damaged(MALFORMED, "search", replaced)
        p.passes.damaged(MALFORMED, "check", replaced)
    finally:
        replaced.store.close()
        p.passes.index.store.close()
    assert p.passes.damage is None
    assert sample(p.metrics, "metis_index_damage_found_total", found_by="search") == 1
    assert sample(p.metrics, "metis_index_damage_found_total", found_by="check") == 1


def test_no_pass_is_taken_while_a_replacement_takes_over(tmp_path: Path) -> None:
    p = parts(tmp_path)
    p.progress.set_phase("standby", "another indexer is writing this index")
    try:
        with pytest.raises(Conflict) as e:
            p.passes.request(full=True)
    finally:
        p.passes.index.store.close()
    assert e.value.code == "STANDBY"


def test_a_pass_reads_the_base_s_own_notes_beside_its_sources(tmp_path: Path) -> None:
    p = parts(tmp_path)
    p.passes.index.store.close()
    [docs, own] = p.passes.sources()
    assert (docs.drive, docs.root) == ("docs", p.drive)
    assert (own.drive, own.root) == (notes.source("team"), tmp_path / "index" / "notes")
