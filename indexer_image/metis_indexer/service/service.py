"""One knowledge base's indexer as a running service: its parts made and wired, and their
life in one place. Starting it starts the reader pool and the tasks (the passes, the
integrity check, the configuration followed); stopping it ends them and lets go of the
clients, the index and the writer lock.

Only one indexer writes an index folder: the one holding its writer lock. Another one on
the same folder (a replacement taking over) stands by, answering searches from the index
as loaded, until the writer stops writing; a damaged index is rebuilt only by the writer.
A stopping indexer stops writing first (`stop_writing`), so its replacement takes over
while it still answers searches.

The parts: `passes` (the pass loop and the rebuild, composing the changes made beside the
index, `changes`), `model_watch` (the embedding model waited for), `following` (a changed
configuration), `answers` (what the API asks), `progress` (the phase and counts a status
shows), `notebook` (the base's own notes), `configured` (the configuration and its model
clients now), `restoring` (an empty index restored from a backup at start), `backups` (the
base's backups to its object store).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from pathlib import Path

from metis_indexer.config import IndexerConfig
from metis_indexer.configured import Configured
from metis_indexer.index import folders
from metis_indexer.index.memory import Totals
from metis_indexer.ingest.readers.pool import ReaderPool
from metis_indexer.metrics import Metrics
from metis_indexer.service import restoring
from metis_indexer.service.answers import Answers
from metis_indexer.service.backups import Backups
from metis_indexer.service.following import Follower
from metis_indexer.service.model_watch import ModelWatch
from metis_indexer.service.passes import Passes
from metis_indexer.service.progress import OnProgress, Progress
from metis_indexer.service.restoring import Restorer

log = logging.getLogger("metis.indexer")

LOCK_FILE = "writer.lock"
STANDBY_LOOK = 1.0
"""Seconds between looks, in standby, at whether the writing indexer has stopped."""


class Indexer:
    """One knowledge base's indexer. `on_progress` is told of each change of the passes'
    state (`metis serve`'s progress bar); `token`: the base's, sent to its peers."""

    def __init__(
        self,
        config: IndexerConfig,
        metrics: Metrics | None = None,
        on_progress: OnProgress | None = None,
        token: str | None = None,
    ) -> None:
        self.metrics = metrics or Metrics.create()
        self.configured = Configured(config)
        self.progress = Progress(self.metrics, self._totals, on_progress)
        watch = ModelWatch(self.configured, self.progress)
        self.passes = Passes(self.configured, self.progress, watch, self.metrics, token)
        self.restorer = Restorer(self.configured, self.progress)
        """The restore of an empty index from a backup, at start (`restoring`)."""
        self.answers = Answers(
            self.configured, self.progress, self.passes, self.metrics, self.restorer
        )
        self.backups = Backups(self.configured, self.passes, self.metrics)
        """The base's backups to its object store (`POST /v1/backups`)."""
        self._pool: ReaderPool | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._lock_fd: int | None = None
        self.stopping = False
        """Whether it has stopped writing (`stop_writing`): it only answers reads now."""

    def _totals(self) -> Totals:
        return self.passes.index.totals()

    async def start(self, follow: Path | None = None) -> None:
        """The reader pool and the tasks; `follow`: the configuration file to follow."""
        pool = self._pool = ReaderPool(self.configured.config.workers)
        self._tasks = [
            asyncio.create_task(self._run(pool), name="metis-passes"),
            asyncio.create_task(self.passes.check_pages(), name="metis-integrity"),
        ]
        if follow is not None:
            follower = Follower(self.configured, self.passes)
            self._tasks.append(asyncio.create_task(follower.follow(follow), name="metis-config"))

    async def stop_writing(self) -> None:
        """The tasks ended, last started first (the passes, the integrity check, the
        configuration followed), the reader pool closed and the writer lock let go: an
        indexer standing by on the same folder takes over the writing at once. The index
        and the model clients stay open, for searches."""
        self.stopping = True
        for task in reversed(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._pool is not None:
            await asyncio.to_thread(self._pool.close)
            self._pool = None
        await asyncio.to_thread(self.passes.index.writes_done)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def stop(self) -> None:
        """Writing stopped (`stop_writing`), then the clients and the index let go."""
        await self.stop_writing()
        await self.backups.close()
        await self.configured.close()
        await self.passes.close()
        self.passes.index.store.close()

    async def _run(self, pool: ReaderPool) -> None:
        """Restore an empty index from its backup (the writer, once; `restoring`), load the
        index (a damaged one is rebuilt by the writer), answer searches, stand by while
        another indexer writes it, then run the passes."""
        config = self.configured.config
        if await asyncio.to_thread(restoring.needed, config):
            config.index_dir.mkdir(parents=True, exist_ok=True)
            while not self._take_index():
                self.progress.set_phase("standby", "another indexer is writing this index")
                await asyncio.sleep(STANDBY_LOOK)
            if await asyncio.to_thread(restoring.needed, config):  # not done by that one
                await self.restorer.run()
        elif await asyncio.to_thread(restoring.seedable, config):
            config.index_dir.mkdir(parents=True, exist_ok=True)
            if self._take_index() and await asyncio.to_thread(restoring.seedable, config):
                await self.restorer.seed()
        damage = await self.passes.open()
        if damage is not None:
            while not self._take_index():
                self.progress.set_phase(
                    "standby", "the index is damaged; the indexer writing it will rebuild it"
                )
                await asyncio.sleep(STANDBY_LOOK)
            await self.passes.rebuild(damage)
        self.passes.loaded = True
        self.progress.publish()
        if not self._take_index():
            await self._stand_by()
        await self.passes.loop(pool)

    def _take_index(self) -> bool:
        """Become the one indexer writing this index folder (a lock the system drops when
        the process ends, however it ends)."""
        if self._lock_fd is not None:
            return True
        folder = self.configured.config.index_dir
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    async def _stand_by(self) -> None:
        """Another indexer writes this index (the one a replacement takes over from):
        answer searches from the index as loaded until it stops, then take over."""
        self.progress.set_phase(
            "standby",
            "another indexer is writing this index; searches are answered from it "
            "until that one stops",
        )
        index_dir = self.configured.config.index_dir
        while not self._take_index():
            # The writer built a new chunking's index beside and switched to it: its old
            # files are removed once its own searches on them end.
            if await asyncio.to_thread(folders.live, index_dir) != self.passes.index.folder:
                await self.passes.reopen()
            await asyncio.sleep(STANDBY_LOOK)
        log.info("the other indexer stopped: taking over the index")
        await self.passes.reopen()
        self.progress.set_phase("loading", "")
