"""The configuration file followed (a ConfigMap's mount): each change is taken at once, the
model clients made again where the models changed (questions go on to the model whose
vectors the index holds until the new model's are made), the vectors held the new way, and
a pass asked for (it reads again what must be). One that cannot run is logged, and the running
configuration kept."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from metis_indexer.config import ConfigError, IndexerConfig, load
from metis_indexer.configured import Configured
from metis_indexer.service.passes import Passes

FOLLOW_SECONDS = 5
"""Seconds between looks at the configuration file."""

log = logging.getLogger("metis")


class Follower:
    """Takes each configuration the file says into what the indexer runs."""

    def __init__(self, configured: Configured, passes: Passes) -> None:
        self._configured = configured
        self._passes = passes

    async def follow(self, path: Path) -> None:
        """Look at `path` every FOLLOW_SECONDS; apply what changed."""
        last = path.read_bytes()
        while True:
            await asyncio.sleep(FOLLOW_SECONDS)
            try:
                current = path.read_bytes()
            except OSError:
                continue
            if current != last:
                last = current
                try:
                    await self.apply(load(path))
                except ConfigError as e:
                    log.error("configuration not applied: %s", e)

    async def apply(self, config: IndexerConfig) -> None:
        """Take a changed configuration; a pass follows (it re-reads what must be)."""
        old = self._configured.config
        if config == old:
            return
        self._configured.take(config)
        if self._passes.loaded:
            await self._passes.model_change.follow_recorded()
        if config.vectors != old.vectors and self._passes.loaded:
            await asyncio.to_thread(self._passes.index.hold_vectors, config.vectors)
        self._passes.request()
