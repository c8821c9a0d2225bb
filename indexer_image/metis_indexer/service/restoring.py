"""An empty index restored from a backup at start, before its first pass: the index and
the notes as they were backed up, so the pass after finds every file unchanged and the
model embeds nothing.

Each object is downloaded into a staging folder of the index drive and checked against
the manifest (size and SHA-256: what the store says of it is not trusted); then the notes
are unpacked, and the index moved into place last, by a rename. A marker file is kept
from before the notes are unpacked until the index is in place: a kill at any moment
leaves either no index and the marker (the next start restores again) or the index
whole. A restore that cannot be done (no such backup, an object that does not match, the
store not answering) is said in the status and tried again every `RETRY_SECONDS`; no
pass runs meanwhile, so nothing is embedded from scratch by mistake.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import sqlite3
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from metis_indexer import notes
from metis_indexer.backups import copies, manifest
from metis_indexer.backups.manifest import BackupRefused, Manifest
from metis_indexer.backups.objects import NoSuchObject, ObjectStore, StoreError
from metis_indexer.changes import peers
from metis_indexer.config import IndexerConfig, RestoreConfig
from metis_indexer.configured import Configured
from metis_indexer.files import sync_folder
from metis_indexer.index import folders, texts
from metis_indexer.models.clients import ModelRefused, ModelUnavailable
from metis_indexer.schema import RestoreState
from metis_indexer.service.progress import Progress

log = logging.getLogger("metis.restore")

RETRY_SECONDS = 30.0
"""Seconds between tries of a restore that could not be done."""
STAGING = ".restore"
"""The folder of the index drive a restore downloads into."""
MARKER = ".restoring"
"""Kept from before the notes are unpacked until the index is in place."""
RESTORED = ".restored"
"""Names the backup restored, once it is: the drive is never restored from it again. A
restore is a base's beginning; an index emptied later (every document deleted, every note
forgotten) stays what the team made of it, and notes forgotten since do not come back."""
SEED_CHECKS = peers.NEW_CHECKS
"""Vectors of a backup a new replica starts from that the model embeds again to compare: as
many as of a new peer's first answers."""
MODEL_SECONDS = 10.0
"""How long a restore waits for the configured model's id, to say what is embedded again."""


def needed(config: IndexerConfig) -> bool:
    """Whether the index is to be restored now: a backup is named, and the index holds no
    chunks and the drive no notes, or a restore was cut short; never again once the drive
    was restored from that backup (`RESTORED`)."""
    if config.restore is None:
        return False
    index_dir = config.index_dir
    if (index_dir / MARKER).exists():
        return True
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if (index_dir / RESTORED).read_text(encoding="utf-8").strip() == config.restore.backup:
            return False
    return _empty(index_dir)


def seedable(config: IndexerConfig) -> bool:
    """Whether a replica may start from its base's newest backup: it has peers (other
    replicas of the base), a backup store and no backup named to restore, and its drive is
    empty and was never restored."""
    if config.restore is not None or config.backup_store is None or not config.peers:
        return False
    index_dir = config.index_dir
    return not (index_dir / RESTORED).exists() and _empty(index_dir)


def _empty(index_dir: Path) -> bool:
    database = folders.live(index_dir) / "index.sqlite3"
    held_notes = any(notes.folder(index_dir).glob("*" + notes.SUFFIX))
    return copies.chunk_count(database) == 0 and not held_notes


def sampled(index_dir: Path, count: int) -> tuple[list[str], npt.NDArray[np.float32]]:
    """Up to `count` chunks of the index with a vector, drawn at random: the passage each
    was embedded from and its vector."""
    database = folders.live(index_dir) / "index.sqlite3"
    db = sqlite3.connect(f"file:{database}?mode=ro", uri=True, isolation_level=None)
    try:
        rows = db.execute(
            "SELECT files.title, chunks.headings, chunks.text, chunks.vector"
            " FROM chunks JOIN files ON files.id = chunks.file_id"
            " WHERE chunks.vector IS NOT NULL ORDER BY random() LIMIT ?",
            (count,),
        ).fetchall()
    finally:
        db.close()
    passages = [texts.passage(t, tuple(json.loads(h)), x) for t, h, x, _ in rows]
    vectors = [np.frombuffer(v, dtype="<f4") for *_, v in rows]
    return passages, np.stack(vectors) if vectors else np.zeros((0, 0), dtype=np.float32)


def unseeded(index_dir: Path) -> None:
    """A seed the model does not agree with, taken away: the drive empty again."""
    folders.remove(index_dir, folders.live(index_dir))
    shutil.rmtree(notes.folder(index_dir), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        (index_dir / RESTORED).unlink()
    sync_folder(index_dir)


def completed(store: ObjectStore) -> list[Manifest]:
    """The manifests of the store's completed backups (one that does not read is left out,
    said in the log)."""
    found = []
    for name in store.names(manifest.MANIFEST)[manifest.MANIFEST]:
        try:
            raw = store.read(manifest.key(store.config.prefix, name, manifest.MANIFEST))
            found.append(manifest.read(name, raw))
        except (BackupRefused, NoSuchObject) as e:
            log.warning("%s", e)
    return found


def restore(config: IndexerConfig, wanted: RestoreConfig) -> Manifest:
    """The backup `wanted` restored into `config`'s empty index drive (in a thread);
    BackupRefused or StoreError saying why not, the drive left as it was but for the
    staging folder."""
    index_dir, name = config.index_dir, wanted.backup
    store = ObjectStore(wanted.store)
    staging = index_dir / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        key = manifest.key(wanted.store.prefix, name, manifest.MANIFEST)
        try:
            found = manifest.read(name, store.read(key))
        except NoSuchObject:
            raise BackupRefused(
                f"backup {name}: no {manifest.MANIFEST} at s3://{wanted.store.bucket}/{key}: "
                "there is no such backup, or it was not finished"
            ) from None
        for obj in manifest.OBJECTS:
            path = staging / obj
            try:
                store.download(manifest.key(wanted.store.prefix, name, obj), path)
            except NoSuchObject:
                raise BackupRefused(f"backup {name}: its {obj} is missing from the store") from None
            why = manifest.mismatch(name, obj, found.files[obj], copies.summed(path))
            if why is not None:
                raise BackupRefused(why)
        database = staging / manifest.INDEX
        if found.base != config.name:
            renamed = copies.rename_source(
                database, notes.source(found.base), notes.source(config.name)
            )
            log.info(
                "backup %s is of base %s: its %d notes are made this base's (%s)",
                name,
                found.base,
                renamed,
                notes.source(config.name),
            )
        (index_dir / MARKER).touch()
        sync_folder(index_dir)
        held = notes.folder(index_dir)
        shutil.rmtree(held, ignore_errors=True)
        copies.unpack_notes(staging / manifest.NOTES, held)
        live = folders.live(index_dir)
        folders.remove(index_dir, live)
        live.mkdir(parents=True, exist_ok=True)
        os.replace(database, live / "index.sqlite3")
        sync_folder(live)
        (index_dir / RESTORED).write_text(name + "\n", encoding="utf-8")
        (index_dir / MARKER).unlink()
        sync_folder(index_dir)
        return found
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class Restorer:
    """The restore of this index at start, and what the status says of it."""

    def __init__(self, configured: Configured, progress: Progress) -> None:
        self._configured = configured
        self._progress = progress
        self.state: RestoreState | None = None
        self.restored: Manifest | None = None
        """The manifest of the backup restored, once it is."""

    def status(self) -> RestoreState | None:
        """The restore as the status shows it: what is embedded again, once known."""
        if self.state is None or self.restored is None:
            return self.state
        embedder = self._configured.embedder
        chunking = self._configured.config.chunking
        model = None if embedder is None else embedder.model
        again = manifest.reembedding(self.restored, model, chunking.size, chunking.overlap)
        return self.state.model_copy(update={"reembedding": again})

    async def run(self) -> None:
        """Restore, trying again every `RETRY_SECONDS` until it is done."""
        config = self._configured.config
        wanted = config.restore
        assert wanted is not None
        self.state = RestoreState(
            backup=wanted.backup, phase="Restoring", chunks=0, notes=0, error=None, reembedding=None
        )
        while True:
            self._progress.set_phase("loading", f"restoring the index from backup {wanted.backup}")
            started = time.monotonic()
            try:
                found = await asyncio.to_thread(restore, config, wanted)
            except (BackupRefused, StoreError, OSError) as e:
                why = str(e) if not isinstance(e, OSError) else f"backup {wanted.backup}: {e}"
                log.error(
                    "the restore cannot be done: %s (tried again in %.0f s)", why, RETRY_SECONDS
                )
                self.state = self.state.model_copy(update={"phase": "Failed", "error": why})
                self._progress.set_phase(
                    "waiting",
                    f"the index cannot be restored: {why}; tried again every "
                    f"{RETRY_SECONDS:g} s, nothing is indexed meanwhile",
                )
                await asyncio.sleep(RETRY_SECONDS)
                continue
            break
        self.restored = found
        self.state = RestoreState(
            backup=wanted.backup,
            phase="Restored",
            chunks=found.chunks,
            notes=found.notes,
            error=None,
            reembedding=None,
        )
        log.info(
            "restored backup %s (base %s, %s) in %.1f s: %d chunks, %d notes",
            wanted.backup,
            found.base,
            found.finished_at,
            time.monotonic() - started,
            found.chunks,
            found.notes,
        )
        await self._say_reembedding()
        self._progress.set_phase("loading", "")

    async def seed(self) -> None:
        """A new replica's index started from the newest backup of its model and chunking,
        instead of every vector from its peers or the model. The backup is input, as a
        peer's answer is: `SEED_CHECKS` of its vectors, drawn at random, are embedded by the
        model too, and one unlike the model's (`peers.unlike`) takes the seed away. Any
        trouble leaves the drive empty, to be filled as any replica's is."""
        config = self._configured.config
        embedder = self._configured.embedder
        store_config = config.backup_store
        if embedder is None or store_config is None:
            return
        chunking = config.chunking
        try:
            await asyncio.wait_for(embedder.connect(), MODEL_SECONDS)
            found = await asyncio.to_thread(completed, ObjectStore(store_config))
        except (ModelUnavailable, TimeoutError, OSError, StoreError) as e:
            log.info("no backup to start from (%s): the peers and the model fill the index", e)
            return
        pick = manifest.newest_of(
            found,
            config.name,
            embedder.model or "",
            embedder.dimensions,
            chunking.size,
            chunking.overlap,
        )
        if pick is None:
            log.info(
                "no backup of base %s, model %s and this chunking among %d: the peers and the "
                "model fill the index",
                config.name,
                embedder.model,
                len(found),
            )
            return
        self._progress.set_phase("loading", f"starting from backup {pick.name}")
        started = time.monotonic()
        try:
            await asyncio.to_thread(
                restore, config, RestoreConfig(store=store_config, backup=pick.name)
            )
            passages, held = await asyncio.to_thread(sampled, config.index_dir, SEED_CHECKS)
            why = peers.unlike(held, await embedder.embed_now(passages)) if passages else None
        except (
            BackupRefused,
            StoreError,
            OSError,
            ModelUnavailable,
            ModelRefused,
            ValueError,
        ) as e:
            why = str(e)
        if why is not None:
            log.warning("backup %s is not started from: %s", pick.name, why)
            await asyncio.to_thread(unseeded, config.index_dir)
        else:
            log.info(
                "started from backup %s (%s) in %.1f s: %d chunks, %d of their vectors "
                "checked against the model",
                pick.name,
                pick.finished_at,
                time.monotonic() - started,
                pick.chunks,
                len(passages),
            )
        self._progress.set_phase("loading", "")

    async def _say_reembedding(self) -> None:
        """Logs what the restored index embeds again (the configured model asked its id,
        not to embed anything)."""
        embedder = self._configured.embedder
        if embedder is not None and embedder.model is None:
            with contextlib.suppress(ModelUnavailable, TimeoutError, OSError):
                await asyncio.wait_for(embedder.connect(), MODEL_SECONDS)
        state = self.status()
        if state is not None and state.reembedding:
            log.info("restored backup %s: %s", state.backup, state.reembedding)
