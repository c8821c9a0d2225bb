"""Reading documents in worker processes that can be killed.

Parsers are where a pass can hang or crash: a PDF that takes minutes, a parser
bug that recurses forever, a decompression bomb. So documents are read (and,
when asked, chunked) in a pool of worker processes, never in the indexer's own.
Each task has a deadline (a PDF is given 120 s to read); a worker
past it is killed and replaced, and the document fails with `TIMEOUT`. A worker
that dies (a segfault, the kernel's OOM killer) fails its document, it does not
hang the pass. Workers also run under an address-space limit, so most runaway
allocations end as a `MemoryError` in the worker rather than an OOM kill.

One dispatcher thread owns the workers: it hands tasks to idle workers, waits on
their pipes with the nearest deadline as timeout, and resolves each task's
`concurrent.futures.Future`. Callers submit from any thread, or await
`read_chunks` from asyncio.

The indexer's own work on the files of a pass (hashing them, noting those unchanged) runs
on `FileThreads`, the pool's `files`: threads of their own with a deadline, never the event
loop's default executor, which searches rank on. A read that never returns (a hung NFS
server) pins one of those threads, not a search's, and not the process's exit.

Usage::

    with ReaderPool(workers=2) as pool:
        done = pool.submit_read(path, Kind.PDF).result()  # Done(result=ParsedDocument | ReadFailed)
        chunks = await pool.read_chunks(path, Kind.MD, 1200, 200)  # list[Chunk] | ReadFailed
        counted = await pool.read_counted(path, Kind.MD, 1200, 200)  # CountedChunks | ...
        digest = await pool.files.within(drive, file_hash, path, drive)  # or ReadFailed
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import itertools
import multiprocessing
import multiprocessing.connection
import os
import queue
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Generic, TypeVar

from metis_indexer.documents import Chunk, FailReason, Kind, ParsedDocument, ReadFailed
from metis_indexer.index.memory import count_words
from metis_indexer.index.store import Terms
from metis_indexer.ingest import chunking, readers
from metis_indexer.ingest.readers.failures import detail

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """What one document may take in a worker."""

    pdf_seconds: float = 120.0
    """A PDF is given 120 s to read."""
    other_seconds: float = 60.0
    """Every other kind: the slowest real files (a 12 MB document.xml, a 1.6 MB web
    page) read in a few seconds, so a minute means a parser is stuck, not busy."""
    memory_bytes: int | None = 2 * 1024**3
    """Address space of a worker (RLIMIT_AS); None: unlimited. A worker peaks at
    about 600 MB on the torture set's worst file; a bomb would take far more."""
    file_seconds: float = 60.0
    """Hashing one file in the indexer's own threads: at most 64 MB, a second on a healthy
    drive and seconds on a slow network one, so a minute means the drive is hung."""

    def seconds(self, kind: Kind) -> float:
        return self.pdf_seconds if kind is Kind.PDF else self.other_seconds


@dataclasses.dataclass(frozen=True, slots=True)
class CountedChunks:
    """A document's chunks with their words counted, as the keyword index stores them."""

    chunks: list[Chunk]
    terms: Terms


@dataclasses.dataclass(frozen=True, slots=True)
class Cutting:
    """How a worker cuts the document it read into chunks."""

    size: int
    overlap: int
    count_words: bool
    """Whether it counts the chunks' words too (`CountedChunks`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Done(Generic[T]):
    """A finished task: its result, and the seconds it took in its worker."""

    result: T | ReadFailed
    seconds: float


@dataclasses.dataclass(slots=True)
class _Task:
    id: int
    path: Path
    kind: Kind
    root: Path | None
    cutting: Cutting | None
    """None: read only."""
    future: Future[Done[Any]]


@dataclasses.dataclass(frozen=True, slots=True)
class _Request:
    """A task as its worker receives it: plain values, as it crosses a pipe."""

    task: int
    path: str
    kind: str
    root: str | None
    cutting: Cutting | None


@dataclasses.dataclass(frozen=True, slots=True)
class _Reply:
    """A task's end as its worker sends it back."""

    task: int
    seconds: float
    result: Any = None
    """The document, its chunks, or its `CountedChunks`; None when it failed."""
    reason: str | None = None
    """The `FailReason`'s name when it failed, and why in `detail`."""
    detail: str = ""


@dataclasses.dataclass(slots=True)
class _Worker:
    process: BaseProcess
    conn: multiprocessing.connection.Connection
    ready: bool = False
    task: _Task | None = None
    started: float = 0.0
    deadline: float = 0.0


_READY = "ready"
STARTUP_SECONDS = 120.0
"""Time a new worker has to import the parsers and say it is ready (seconds on an
idle machine); one that takes longer means a broken install, not a slow one."""


class ReaderPool:
    """A fixed number of worker processes reading documents, each under a deadline."""

    def __init__(self, workers: int = 2, limits: Limits | None = None) -> None:
        if workers < 1:
            raise ValueError(f"a reader pool needs at least 1 worker, not {workers}")
        self.limits = limits or Limits()
        # Workers are forked from a server process that imported the program and this
        # module once (never from this threaded process): a spawned worker imported them
        # itself, about a second of CPU each, and so did each one that replaced a killed worker.
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(["__main__", __name__])
        self._lock = threading.Lock()
        self._pending: collections.deque[_Task] = collections.deque()
        self._ids = itertools.count()
        self._closed = False
        self._broken: str | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._workers = [self._start_worker() for _ in range(workers)]
        self._thread = threading.Thread(target=self._dispatch, name="metis-readers", daemon=True)
        self._thread.start()
        self.files = FileThreads(seconds=self.limits.file_seconds)
        """The pass's own file work, on threads of its own (see `FileThreads`)."""

    @property
    def pids(self) -> tuple[int | None, ...]:
        """The workers' process ids, to watch or signal them."""
        return tuple(w.process.pid for w in self._workers)

    def __enter__(self) -> ReaderPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- submitting -------------------------------------------------------------------------

    def submit_read(
        self, path: Path, kind: Kind, root: Path | None = None
    ) -> Future[Done[ParsedDocument]]:
        """Reads `path` as `kind` in a worker; with `root`, only if it is inside it."""
        return self._submit(path, kind, root, None)

    def submit_chunks(
        self, path: Path, kind: Kind, size: int, overlap: int, root: Path | None = None
    ) -> Future[Done[list[Chunk]]]:
        """Reads and chunks `path` in a worker, so only chunks come back."""
        chunking.check(size, overlap)  # bad settings fail here, not per document
        return self._submit(path, kind, root, Cutting(size, overlap, count_words=False))

    async def read_chunks(
        self, path: Path, kind: Kind, size: int, overlap: int, root: Path | None = None
    ) -> list[Chunk] | ReadFailed:
        """`submit_chunks` for asyncio callers; the result alone."""
        done = await asyncio.wrap_future(self.submit_chunks(path, kind, size, overlap, root))
        return done.result

    async def read_counted(
        self, path: Path, kind: Kind, size: int, overlap: int, root: Path | None = None
    ) -> CountedChunks | ReadFailed:
        """`read_chunks`, with the chunks' words counted in the worker too: a pass's
        tokenising runs beside the indexer's own process rather than in it."""
        chunking.check(size, overlap)
        future = self._submit(path, kind, root, Cutting(size, overlap, count_words=True))
        done: Done[CountedChunks] = await asyncio.wrap_future(future)
        return done.result

    def close(self) -> None:
        """Stops the workers; tasks not finished raise RuntimeError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.files.close()
        self._poke()
        self._thread.join()
        self._wake_r.close()
        self._wake_w.close()

    def _submit(
        self, path: Path, kind: Kind, root: Path | None, cutting: Cutting | None
    ) -> Future[Any]:
        future: Future[Done[Any]] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the reader pool is closed")
            if self._broken is not None:
                raise RuntimeError(self._broken)
            self._pending.append(_Task(next(self._ids), path, kind, root, cutting, future))
        self._poke()
        return future

    def _poke(self) -> None:
        with contextlib.suppress(BlockingIOError):  # it has wake-ups enough queued
            self._wake_w.send(b"\0")

    # -- the dispatcher thread --------------------------------------------------------------

    def _dispatch(self) -> None:
        try:
            while not self._closed and self._broken is None:
                self._assign()
                waiting = [w.conn for w in self._workers if w.task is not None or not w.ready]
                ready = multiprocessing.connection.wait([*waiting, self._wake_r], self._timeout())
                if self._wake_r in ready:
                    self._drain_wake()
                for worker in list(self._workers):
                    if worker.conn in ready:
                        self._receive(worker)
                self._enforce_deadlines()
        finally:
            self._shutdown()

    def _assign(self) -> None:
        for i, worker in enumerate(self._workers):
            if not worker.ready or worker.task is not None:
                continue
            task = self._next_task()
            if task is None:
                return
            try:
                worker.conn.send(
                    _Request(
                        task.id,
                        str(task.path),
                        task.kind.value,
                        None if task.root is None else str(task.root),
                        task.cutting,
                    )
                )
            except OSError:  # it died while idle: not the document's fault, so it waits again
                self._replace(i)
                with self._lock:
                    self._pending.appendleft(task)
                continue
            worker.task = task
            worker.started = time.monotonic()
            worker.deadline = worker.started + self.limits.seconds(task.kind)

    def _next_task(self) -> _Task | None:
        with self._lock:
            while self._pending:
                task = self._pending.popleft()
                if task.future.running() or task.future.set_running_or_notify_cancel():
                    return task
        return None

    def _timeout(self) -> float | None:
        deadlines = [w.deadline for w in self._workers if w.task is not None or not w.ready]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass

    def _receive(self, worker: _Worker) -> None:
        index = self._workers.index(worker)
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            self._died(index)
            return
        if message == _READY:
            worker.ready = True
            return
        reply: _Reply = message
        task = worker.task
        worker.task = None
        if task is None or task.id != reply.task:
            return
        if reply.reason is None:
            task.future.set_result(Done(reply.result, reply.seconds))
        else:
            failed = ReadFailed(FailReason[reply.reason], reply.detail)
            task.future.set_result(Done(failed, reply.seconds))

    def _died(self, index: int) -> None:
        worker = self._workers[index]
        worker.process.join(timeout=5)
        code = worker.process.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit {code}"
        if not worker.ready:
            self._break(f"a reader process could not start ({how})")
            return
        self._replace(index)
        if worker.task is not None:
            why = f"the reader process died reading it ({how})"
            self._fail(worker.task, FailReason.MALFORMED, why, time.monotonic() - worker.started)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for i, worker in enumerate(self._workers):
            if not worker.ready and now >= worker.deadline:
                self._break(f"a reader process did not start within {STARTUP_SECONDS:g} s")
                return
            task = worker.task
            if task is not None and now >= worker.deadline:
                self._replace(i)  # before the caller hears of it: stopped means stopped
                why = f"stopped after {self.limits.seconds(task.kind):g} s"
                self._fail(task, FailReason.TIMEOUT, why, now - worker.started)

    def _fail(self, task: _Task, reason: FailReason, why: str, seconds: float = 0.0) -> None:
        task.future.set_result(Done(ReadFailed(reason, why), seconds))

    def _break(self, why: str) -> None:
        """Workers cannot start (a broken install): fail loudly rather than retry forever."""
        with self._lock:
            self._broken = why

    def _start_worker(self) -> _Worker:
        parent, child = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=_serve, args=(child, self.limits.memory_bytes), name="metis-reader", daemon=True
        )
        process.start()
        child.close()  # else the parent holds the pipe open and never sees the worker die
        return _Worker(process, parent, deadline=time.monotonic() + STARTUP_SECONDS)

    def _replace(self, index: int) -> None:
        self._stop(self._workers[index])
        self._workers[index] = self._start_worker()

    def _stop(self, worker: _Worker) -> None:
        worker.process.kill()
        worker.process.join(timeout=5)
        worker.conn.close()

    def _shutdown(self) -> None:
        """Kills the workers; unfinished tasks raise why (a future already running
        cannot be cancelled)."""
        why = RuntimeError(self._broken or "the reader pool was closed")
        for worker in self._workers:
            if worker.task is not None:
                worker.task.future.set_exception(why)
            self._stop(worker)
        with self._lock:
            pending, self._pending = list(self._pending), collections.deque()
        for task in pending:
            if task.future.running() or task.future.set_running_or_notify_cancel():
                task.future.set_exception(why)


FILE_THREADS = min(32, (os.cpu_count() or 1) + 4)
"""File work at once: what asyncio's default executor gave it before it moved here (six
on two cores). Four made a pass of unchanged files about 1.2 times slower."""
MOST_HUNG = 8
"""Reads of one drive left past their deadline, still not returned, before that drive's
other files fail at once: each would pin one more thread for good."""


@dataclasses.dataclass(eq=False, slots=True)
class _Job:
    call: Callable[[], Any]
    future: Future[Any]
    drive: Path | None
    timed: bool
    """Under the deadline; a pass's index work (noting a file unchanged) is not."""
    deadline: float = 0.0
    hung: bool = False
    """Failed at its deadline; the thread is still in it."""


class FileThreads:
    """Threads for the indexer's own work on files of its drives, with a deadline.

    Up to `threads` threads take calls from one queue, as an executor's do. A call still
    running at its deadline (counted from when it started) fails with TIMEOUT, and its
    thread, left to it, is replaced: a later call never waits behind a hung one. The
    threads are daemons and never joined: Python cannot stop a thread blocked in the kernel
    (a read from a hung NFS server), and such a thread must not keep the process from
    exiting on SIGTERM. asyncio's default executor would be joined at exit, and it is where
    searches rank. One watchdog thread keeps the deadlines, as the reader pool's dispatcher
    does its workers'.
    """

    def __init__(
        self, threads: int = FILE_THREADS, seconds: float = 60.0, most_hung: int = MOST_HUNG
    ) -> None:
        self.threads = threads
        self.seconds = seconds
        self.most_hung = most_hung
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._changed = threading.Condition()
        self._live = 0
        """Threads started and not left in a hung call."""
        self._timed: set[_Job] = set()
        """Calls under the deadline, running now."""
        self._hung: collections.Counter[Path | None] = collections.Counter()
        self._closed = False
        threading.Thread(target=self._watch, name="metis-files-watch", daemon=True).start()

    def hung(self, drive: Path | None) -> int:
        """Calls on `drive`'s files failed at their deadline and not returned since."""
        with self._changed:
            return self._hung[drive]

    def submit(self, drive: Path | None, fn: Callable[..., T], *args: Any) -> Future[T]:
        """`fn(*args)`, work on a file of `drive`; the future fails with `ReadFailed`
        (TIMEOUT) if it runs past `seconds`, or at once while `most_hung` of the drive's
        calls have not returned."""
        with self._changed:
            hung = self._hung[drive]
        if hung >= self.most_hung:
            refused: Future[T] = Future()
            refused.set_exception(
                ReadFailed(
                    FailReason.TIMEOUT,
                    f"{hung} reads of its drive have not returned in {self.seconds:g} s "
                    "(is the drive hung?)",
                )
            )
            return refused
        return self._put(_Job(functools.partial(fn, *args), Future(), drive, timed=True))

    async def within(self, drive: Path | None, fn: Callable[..., T], *args: Any) -> T:
        """`submit` for asyncio callers: the result, or its exception raised."""
        result: T = await asyncio.wrap_future(self.submit(drive, fn, *args))
        return result

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on these threads with no deadline: a pass's index work, which must
        not queue on the default executor before searches."""
        job = _Job(functools.partial(fn, *args), Future(), None, timed=False)
        result: T = await asyncio.wrap_future(self._put(job))
        return result

    def close(self) -> None:
        """Ends the threads once the calls queued are done (a hung one's when it returns)."""
        with self._changed:
            self._closed = True
            live = self._live
            self._changed.notify_all()
        for _ in range(live):
            self._jobs.put(None)

    def _put(self, job: _Job) -> Future[Any]:
        with self._changed:
            if self._closed:
                raise RuntimeError("the reader pool is closed")
            start = self._live < self.threads
            if start:
                self._live += 1
        self._jobs.put(job)
        if start:
            self._start_thread()
        return job.future

    def _start_thread(self) -> None:
        threading.Thread(target=self._loop, name="metis-files", daemon=True).start()

    def _loop(self) -> None:
        """A thread's life: calls from the queue until told to end or left in a hung one."""
        while (job := self._jobs.get()) is not None:
            if not job.future.set_running_or_notify_cancel():
                continue
            if job.timed:
                with self._changed:
                    job.deadline = time.monotonic() + self.seconds
                    if not self._timed:  # else the watchdog wakes at an earlier deadline
                        self._changed.notify_all()
                    self._timed.add(job)
            try:
                result, error = job.call(), None
            except BaseException as e:  # the caller's to see, as with any executor
                result, error = None, e
            with self._changed:
                self._timed.discard(job)
                hung = job.hung
                if hung:
                    self._hung[job.drive] -= 1
                    if not self._hung[job.drive]:
                        del self._hung[job.drive]
                    back = not self._closed and self._live < self.threads
                    if back:
                        self._live += 1
            if hung:
                if not back:  # it was replaced, and the threads are enough without it
                    return
            elif error is None:
                job.future.set_result(result)
            else:
                job.future.set_exception(error)

    def _watch(self) -> None:
        """Fails each call at its deadline and starts a thread in place of the one in it."""
        with self._changed:
            while not self._closed:
                now = time.monotonic()
                late = [job for job in self._timed if job.deadline <= now]
                for job in late:
                    self._timed.discard(job)
                    job.hung = True
                    self._hung[job.drive] += 1
                    self._live -= 1
                    job.future.set_exception(
                        ReadFailed(
                            FailReason.TIMEOUT,
                            f"reading it from its drive did not finish in {self.seconds:g} s "
                            "(is the drive hung?)",
                        )
                    )
                replace = min(len(late), self.threads - self._live)
                self._live += replace
                for _ in range(replace):
                    self._start_thread()
                nearest = min((job.deadline for job in self._timed), default=None)
                self._changed.wait(None if nearest is None else nearest - now)


def _serve(conn: multiprocessing.connection.Connection, memory_bytes: int | None) -> None:
    """A worker's life: announce readiness, then read one task at a time until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    conn.send(_READY)
    while True:
        try:
            request: _Request = conn.recv()
        except EOFError:
            return
        started = time.perf_counter()
        try:
            result = _work(request)
        except ReadFailed as e:
            took = time.perf_counter() - started
            conn.send(_Reply(request.task, took, reason=e.reason.name, detail=e.detail))
        else:
            conn.send(_Reply(request.task, time.perf_counter() - started, result))


def _work(request: _Request) -> Any:
    """What a task asks of its document; ReadFailed when it cannot be read, or when the
    chunker breaks on it (a chunker bug fails this document, not the pass)."""
    root = None if request.root is None else Path(request.root)
    document = readers.read_document(Path(request.path), Kind(request.kind), root)
    cutting = request.cutting
    if cutting is None:
        return document
    try:
        chunks = chunking.chunk_document(document, cutting.size, cutting.overlap)
        return CountedChunks(chunks, count_words(chunks)) if cutting.count_words else chunks
    except Exception as e:
        raise ReadFailed(FailReason.MALFORMED, detail(e, "chunking")) from None
