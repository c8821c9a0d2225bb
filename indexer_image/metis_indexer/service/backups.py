"""A base's backups (`POST`/`GET`/`DELETE /v1/backups`): one at a time, made in a thread
while searches and passes go on.

A backup copies the index (`copies.copy_index`: one read transaction, the passes keep
writing) and tars the notes while no note is written or forgotten (`Notebook.held`), so
the two agree; both staged on the index drive, then uploaded, then the manifest written
last (`backups.manifest`): a kill at any moment leaves the earlier backups whole and this
one no backup, and a later backup of the same name writes over what it left.

A base's replicas (each its own indexer and drive behind one Service) share its store, so
what a backup is doing is kept there too, not only in the process that runs it: its
`state.json`, written before the start is answered, renewed every `HEARTBEAT` seconds,
made Failed when it fails and deleted once the manifest is written. Every replica answers
a backup from the store (`manifest.seen`): Running while its state is heard of, Failed
(abandoned) once it has not been for `ABANDONED` seconds (its indexer killed); and none
starts a backup that another runs (`manifest.refused`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from metis_indexer.backups import copies, manifest
from metis_indexer.backups.objects import NoSuchObject, ObjectStore, StoreError
from metis_indexer.config import ObjectStoreConfig
from metis_indexer.configured import Configured
from metis_indexer.errors import Conflict, NotFound, Unavailable
from metis_indexer.index.memory import Index
from metis_indexer.ingest.runner import now
from metis_indexer.metrics import Metrics
from metis_indexer.schema import Backup, Chunks
from metis_indexer.service.notebook import Notebook

log = logging.getLogger("metis.backups")

_T = TypeVar("_T")
STAGED = ".backup-{}"
"""The staging files of a backup on the index drive, removed after it (and at the next)."""
HEARTBEAT_VARIABLE = "METIS_BACKUP_HEARTBEAT_SECONDS"


def _heartbeat(default: float = 15.0) -> float:
    said = os.environ.get(HEARTBEAT_VARIABLE, "")
    try:
        seconds = float(said) if said else default
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < 3600:
        log.warning("%s=%r is no number of seconds: %s s it is", HEARTBEAT_VARIABLE, said, default)
        return default
    return seconds


HEARTBEAT = _heartbeat()
"""Seconds between two writes of a running backup's `state.json` (15, or the environment's
METIS_BACKUP_HEARTBEAT_SECONDS: the tests' shorter one)."""
ABANDONED = 4 * HEARTBEAT
"""Seconds a running backup's state may go unrenewed before every indexer answers it
Failed, abandoned, and a start of the same name writes over it."""
STOPPING_SECONDS = 10.0
"""At most this long is spent saying, as the indexer stops, that the backup was cut short."""
HOST = socket.gethostname()
"""The indexer's host name (the pod's name), written in the state of the backups it runs."""


class Backing(Protocol):
    """What a backup copies: the index that answers, and the notes."""

    @property
    def index(self) -> Index: ...

    @property
    def notebook(self) -> Notebook: ...


class _TakenOver(Exception):
    """Another start of the same name (another indexer that found this one abandoned) has
    written its state over this backup's: this one stops, and writes nothing more."""


class Backups:
    """The backups of one base: the one running or the last failed in this process, and
    those the store holds (completed, or running or failed on any indexer sharing it)."""

    def __init__(self, configured: Configured, passes: Backing, metrics: Metrics) -> None:
        self._configured = configured
        self._passes = passes
        self._metrics = metrics
        self.current: Backup | None = None
        """The backup running, or the last one that failed, in this process."""
        self._run: str | None = None
        """The token of `current`'s start, in its state (`manifest.State.run`)."""
        self._task: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()
        """Held by a start from its first look to its task made: one start at a time."""

    def _store(self) -> ObjectStore:
        config: ObjectStoreConfig | None = self._configured.config.backup_store
        if config is None:
            raise Conflict(
                "NO_BACKUP_STORE",
                "this base has no backup store: set backup_store in its configuration",
            )
        return ObjectStore(config)

    async def start(self, name: str) -> Backup:
        """A backup named `name` started, its state written; refused while one runs here,
        while its state says another indexer runs it, or when the store holds a completed
        one of that name."""
        store = self._store()
        async with self._starting:
            return await self._start(store, name)

    async def _start(self, store: ObjectStore, name: str) -> Backup:
        if self._task is not None and not self._task.done():
            assert self.current is not None
            raise Conflict(
                "BACKUP_RUNNING",
                f"backup {self.current.name} is running; ask again when it has finished",
            )
        key = manifest.key(store.config.prefix, name, manifest.MANIFEST)
        completed = await _asked(asyncio.to_thread(store.exists, key))
        state = None if completed else await _asked(asyncio.to_thread(_state, store, name))
        refusal = manifest.refused(name, completed, state, time.time(), ABANDONED)
        if refusal is not None:
            raise Conflict(refusal.code, refusal.message)
        index = self._passes.index
        settings = index.settings()
        chunking = self._configured.config.chunking
        started = Backup(
            name=name,
            phase="Running",
            started_at=now(),
            finished_at=None,
            bytes=0,
            chunks=index.chunk_count,
            notes=len(self._passes.notebook.notes),
            model=settings.model or None if settings else None,
            dimensions=settings.dimensions or None if settings else None,
            chunking=Chunks(
                size=settings.chunk_size if settings else chunking.size,
                overlap=settings.chunk_overlap if settings else chunking.overlap,
            ),
            base=self._configured.config.name,
            error=None,
        )
        run = uuid.uuid4().hex
        written = manifest.starting(started, HOST, run)
        await _asked(asyncio.to_thread(_write_state, store, written))
        # Two indexers asked at the same moment both found no state and wrote theirs: the
        # one whose state is read back runs, the other refuses.
        back = await _asked(asyncio.to_thread(_state, store, name))
        if back is not None and back.run != run:
            raise Conflict(
                "BACKUP_RUNNING",
                f"backup {name} was started on {back.by} at the same moment; ask again when "
                "it has finished",
            )
        self.current, self._run = started, run
        self._task = asyncio.create_task(self._run_backup(store, written), name="metis-backup")
        return started

    async def _run_backup(self, store: ObjectStore, state: manifest.State) -> None:
        begun = time.monotonic()
        started = self.current
        assert started is not None
        folder = self._configured.config.index_dir
        staged_index, staged_notes = (
            folder / STAGED.format("index"),
            folder / STAGED.format("notes"),
        )
        taken: list[manifest.State | None] = []
        stop = asyncio.Event()
        beating = asyncio.create_task(
            self._beat(store, state, stop, taken), name="metis-backup-heartbeat"
        )

        def going_on() -> None:
            if taken:
                raise _TakenOver(_taken_over(started.name, taken[0]))

        step = "copying the index"
        try:
            try:
                await asyncio.to_thread(copies.remove, staged_index, staged_notes)
                async with self._passes.notebook.held():
                    database = self._passes.index.store.path
                    await asyncio.to_thread(copies.copy_index, database, staged_index)
                    step = "packing the notes"
                    notes = await asyncio.to_thread(
                        copies.tar_notes, self._passes.notebook.folder, staged_notes
                    )
                step = "reading the copy"
                held = await asyncio.to_thread(copies.held, staged_index)
                files: dict[str, manifest.FileSum] = {}
                for obj, path in ((manifest.INDEX, staged_index), (manifest.NOTES, staged_notes)):
                    going_on()
                    step = f"uploading {obj}"
                    files[obj] = await asyncio.to_thread(copies.summed, path)
                    key = manifest.key(store.config.prefix, started.name, obj)
                    await asyncio.to_thread(store.upload, path, key)
                chunking = held.chunking or self._configured.config.chunking
                written = manifest.Manifest(
                    format=manifest.FORMAT,
                    base=started.base,
                    name=started.name,
                    started_at=started.started_at,
                    finished_at=now(),
                    chunks=held.chunks,
                    notes=notes,
                    model=held.model,
                    dimensions=held.dimensions,
                    chunking=Chunks(size=chunking.size, overlap=chunking.overlap),
                    files=files,
                )
                step = f"writing {manifest.MANIFEST}"
                await _ended(beating, stop)
                going_on()
                current = await asyncio.to_thread(_state, store, started.name)
                if current is None or current.run != state.run:
                    raise _TakenOver(_taken_over(started.name, current))
                key = manifest.key(store.config.prefix, started.name, manifest.MANIFEST)
                data = written.model_dump_json(indent=2).encode()
                await asyncio.to_thread(store.write, key, data)
            finally:
                await _ended(beating, stop)
                await asyncio.to_thread(copies.remove, staged_index, staged_notes)
        except asyncio.CancelledError:
            why = f"backup {started.name}: {step}: cut short, the indexer stopping"
            self._failed(started, why)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._say_failed(store, state, why), STOPPING_SECONDS)
            raise
        except Exception as e:  # a backup that fails says why, and the indexer goes on
            why = f"backup {started.name}: {step}: {e}"
            self._failed(started, why)
            if not isinstance(e, _TakenOver):
                await self._say_failed(store, state, why)
            return
        done = written.as_backup()
        self.current, self._run = None, None
        try:
            key = manifest.key(store.config.prefix, started.name, manifest.STATE)
            await asyncio.to_thread(store.remove, key)
        except StoreError as e:  # the manifest answers for it all the same
            log.warning("backup %s: its %s is left: %s", started.name, manifest.STATE, e)
        self._metrics.backups.labels(outcome="completed").inc()
        self._metrics.backup_last_completed.set(manifest.stamp(done.finished_at or now()))
        self._metrics.backup_bytes.set(done.bytes)
        log.info(
            "backup %s completed in %.1f s: %d chunks, %d notes, %s bytes",
            done.name,
            time.monotonic() - begun,
            done.chunks,
            done.notes,
            f"{done.bytes:,}",
        )

    def _failed(self, started: Backup, why: str) -> None:
        log.error("%s", why)
        self.current = started.model_copy(
            update={"phase": "Failed", "finished_at": now(), "error": why}
        )
        self._metrics.backups.labels(outcome="failed").inc()

    async def _say_failed(self, store: ObjectStore, state: manifest.State, why: str) -> None:
        """The backup's state made Failed with `why`, unless another start has taken it
        over; a store that does not answer leaves it Running, abandoned in time."""
        try:
            current = await asyncio.to_thread(_state, store, state.name)
            if current is not None and current.run != state.run:
                return
            at = now()
            failed = state.model_copy(update={"phase": "Failed", "updated_at": at, "error": why})
            await asyncio.to_thread(_write_state, store, failed)
        except StoreError as e:
            log.warning("backup %s: its failure is not written in the store: %s", state.name, e)

    async def _beat(
        self,
        store: ObjectStore,
        state: manifest.State,
        stop: asyncio.Event,
        taken: list[manifest.State | None],
    ) -> None:
        """Every HEARTBEAT seconds until `stop`, the state written again, heard of now; when
        it is found another start's (or gone), that start named in `taken`, and no more."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), HEARTBEAT)
                return
            try:
                current = await asyncio.to_thread(_state, store, state.name)
                if current is None or current.run != state.run:
                    taken.append(current)
                    return
                await asyncio.to_thread(
                    _write_state, store, state.model_copy(update={"updated_at": now()})
                )
            except StoreError as e:  # tried again at the next beat; abandoned if it lasts
                log.warning("backup %s: its state is not renewed: %s", state.name, e)

    def _here(self, name: str) -> tuple[Backup | None, str | None]:
        """This process's own backup of `name` (running, or the last failed) and its run."""
        current = self.current
        if current is not None and current.name == name:
            return current, self._run
        return None, None

    async def _seen(
        self, store: ObjectStore, name: str, completed: bool = True, stated: bool = True
    ) -> Backup | None:
        """Backup `name` as the store says it (`manifest.seen`), its manifest and its state
        read where `completed` and `stated` say they may be."""
        done = await self._manifest(store, name) if completed else None
        state = None
        if done is None and stated:
            state = await _asked(asyncio.to_thread(_state, store, name))
        here, run = self._here(name)
        return manifest.seen(done, state, time.time(), ABANDONED, here=here, run=run)

    async def listed(self) -> list[Backup]:
        """Every backup the store holds — completed, running or failed on any indexer — and
        the one running or last failed here."""
        store = self._store()
        found = await _asked(asyncio.to_thread(store.names, manifest.MANIFEST, manifest.STATE))
        completed, stated = set(found[manifest.MANIFEST]), set(found[manifest.STATE])
        names = completed | stated
        if self.current is not None:
            names.add(self.current.name)
        seen = await asyncio.gather(
            *(self._seen(store, n, n in completed, n in stated) for n in sorted(names))
        )
        return [b for b in seen if b is not None]

    async def one(self, name: str) -> Backup:
        backup = await self._seen(self._store(), name)
        if backup is None:
            raise NotFound("BACKUP_NOT_FOUND", f"the store holds no backup {name[:253]}")
        return backup

    async def delete(self, name: str) -> None:
        store = self._store()
        current = self.current
        if current is not None and current.name == name and current.phase == "Running":
            raise Conflict("BACKUP_RUNNING", f"backup {name} is running; delete it once it ends")
        done = await self._manifest(store, name)
        state = await _asked(asyncio.to_thread(_state, store, name))
        refusal = manifest.undeletable(name, done is not None, state, time.time(), ABANDONED)
        if refusal is not None:
            raise Conflict(refusal.code, refusal.message)
        here, run = self._here(name)
        if manifest.seen(done, state, time.time(), ABANDONED, here=here, run=run) is None:
            raise NotFound("BACKUP_NOT_FOUND", f"the store holds no backup {name[:253]}")
        await _asked(asyncio.to_thread(store.delete, name))
        if here is not None:
            self.current, self._run = None, None

    async def _manifest(self, store: ObjectStore, name: str) -> manifest.Manifest | None:
        return await _asked(asyncio.to_thread(_read, store, name, manifest.MANIFEST, manifest.read))

    async def close(self) -> None:
        """A backup running is cut short (its manifest unwritten: it is no backup), its
        state made Failed."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _state(store: ObjectStore, name: str) -> manifest.State | None:
    """Backup `name`'s state in the store; None without one (or with one that is none,
    said in the log: a start writes over it)."""
    return _read(store, name, manifest.STATE, manifest.read_state)


def _read(store: ObjectStore, name: str, obj: str, parse: Callable[[str, bytes], _T]) -> _T | None:
    """Backup `name`'s `obj` read and parsed; None where the store lacks it or it does not
    parse (said in the log)."""
    try:
        raw = store.read(manifest.key(store.config.prefix, name, obj))
    except NoSuchObject:
        return None
    try:
        return parse(name, raw)
    except manifest.BackupRefused as e:
        log.warning("%s", e)
        return None


def _write_state(store: ObjectStore, state: manifest.State) -> None:
    key = manifest.key(store.config.prefix, state.name, manifest.STATE)
    store.write(key, state.model_dump_json(indent=2).encode())


def _taken_over(name: str, by: manifest.State | None) -> str:
    if by is None:
        return f"its {manifest.STATE} was deleted (by an indexer that found it abandoned)"
    return f"started again on {by.by} at {by.started_at}, which found this one abandoned"


async def _ended(beating: asyncio.Task[None], stop: asyncio.Event) -> None:
    """The heartbeat stopped, a write it has begun ended (not cut short: a state written
    after the backup's last would say it runs)."""
    stop.set()
    with contextlib.suppress(Exception):
        await asyncio.shield(beating)


async def _asked(work: Awaitable[_T]) -> _T:
    """The store's answer, its refusals as the API's: 404 for a key it lacks, 503 when it
    cannot be reached or refuses."""
    try:
        return await work
    except NoSuchObject as e:
        raise NotFound("BACKUP_NOT_FOUND", str(e)) from None
    except StoreError as e:
        raise Unavailable("BACKUP_STORE_UNAVAILABLE", str(e)) from None
