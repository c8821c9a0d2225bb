"""The durable index: one SQLite database in WAL mode in the index folder.

A document's file record and all its chunks are written whole or not at all (a
savepoint of a transaction that may carry a few documents), so a kill at any
moment loses at most the documents in flight. Chunks keep their text,
citation, word counts (term ids and counts, as int32 arrays) and their vector
(float32 bytes, or NULL when the embedding model did not answer); loading reads
arrays, it never re-tokenises. No pickles: every value is a plain SQL type.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

WORD_CACHE = 20_000
"""Word ids kept for questions: about 2 MB, and a question's words skip SQLite."""
WRITTEN_WORDS = 1_000_000
"""Word ids kept for writing (about 120 bytes a word; emptied when fuller). While they are
every word on disk (a base of 100,000 chunks of the perf corpus has 218,000 words, ~26 MB), a
word missing from them is new and gets its id without a question to SQLite; looking words up
was a fifth of what writing a chunk cost."""

CHECKPOINT_BYTES = 64 * 1024 * 1024
"""The write-ahead log is copied into the database once it has grown this much, rather than
at SQLite's 4 MB: each checkpoint copies again the pages every transaction touches (the
B-trees' upper pages, the words' index). The log on disk stays about this size."""

WRITER_CACHE_KIB = 32 * 1024
"""The writing connection's page cache: a transaction of a few documents (vectors of
4 KB each) fits in it, and spilling it mid-transaction made writes half again slower.
Readers keep SQLite's default."""

DAMAGED_SUFFIX = ".damaged"
"""A damaged index is moved aside under this suffix (one copy, the latest), for a
person to look at; the index is derived data, rebuilt from the sources."""

PASSED = "first_pass_ended_at"
"""The meta key that says the index has had one whole pass (when the first ended)."""
PASSES_TRACKED = "first_pass_tracked"
"""The meta key an index made empty by this version gets at once: from it on, whether it
has had one whole pass is kept in it (`PASSED`); one without it was made before that was
kept."""

INDEX_FORMAT = 1
"""The index's format, kept in its `meta` as `format`: a change that an older indexer would
misread (a column's meaning, an encoding) raises it, with the migration from the one before.
An indexer meets an index of a newer format after a rollback of its image: it refuses it
(`IndexTooNew`) and changes nothing, where rebuilding would throw away hours of embedding
that the newer image, run again, still reads. An index without the key is format 1 (it was
written before the format was checked)."""

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    id INTEGER PRIMARY KEY,
    source TEXT NOT NULL,
    path TEXT NOT NULL,
    kind TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    hash TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    detail TEXT,
    title TEXT,
    chunks INTEGER NOT NULL DEFAULT 0,
    indexed_at TEXT NOT NULL,
    built_with TEXT NOT NULL DEFAULT '',
    UNIQUE (source, path)
);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY,
    file_id INTEGER NOT NULL REFERENCES files (id) ON DELETE CASCADE,
    ord INTEGER NOT NULL,
    headings TEXT NOT NULL,
    page INTEGER,
    line INTEGER,
    text TEXT NOT NULL,
    terms BLOB NOT NULL,
    vector BLOB
);
CREATE INDEX IF NOT EXISTS chunks_by_file ON chunks (file_id);
CREATE TABLE IF NOT EXISTS staged (
    chunk_id INTEGER PRIMARY KEY REFERENCES chunks (id) ON DELETE CASCADE,
    vector BLOB
);
CREATE TABLE IF NOT EXISTS terms (id INTEGER PRIMARY KEY, word TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS generation (id TEXT NOT NULL, n INTEGER NOT NULL);
INSERT INTO generation SELECT lower(hex(randomblob(16))), 0
    WHERE NOT EXISTS (SELECT 1 FROM generation);
INSERT OR IGNORE INTO meta SELECT '{PASSES_TRACKED}', '1'
    WHERE NOT EXISTS (SELECT 1 FROM chunks);
CREATE TRIGGER IF NOT EXISTS chunk_added AFTER INSERT ON chunks
    BEGIN UPDATE generation SET n = n + 1; END;
CREATE TRIGGER IF NOT EXISTS chunk_changed AFTER UPDATE ON chunks
    BEGIN UPDATE generation SET n = n + 1; END;
CREATE TRIGGER IF NOT EXISTS chunk_dropped AFTER DELETE ON chunks
    BEGIN UPDATE generation SET n = n + 1; END;
"""
"""`generation`: this database's own random id and a count of every change to its chunks,
kept by triggers in the transaction of the change itself, whichever code writes it. What
a load builds from the chunks is kept beside the store tagged with both (`snapshot.py`),
and used only while they still match.

`staged`: a new embedding model's vectors of the chunks, made beside the ones that answer
(`chunks.vector`) until every live chunk has one, then taken in their place in one
transaction (`switch_vectors`). A chunk dropped takes its staged vector with it; a NULL
vector is a chunk the new model refused."""


@dataclasses.dataclass(frozen=True, slots=True)
class FileRecord:
    """What the index knows of one file of a source: enough to skip it next pass."""

    source: str
    path: str
    kind: str
    size: int
    mtime_ns: int
    hash: str
    state: str
    indexed_at: str
    reason: str | None = None
    detail: str | None = None
    title: str | None = None
    chunks: int = 0
    built_with: str = ""
    """The index settings its chunks were made with (`IndexSettings.key`): a change of
    model or chunking re-reads the file even though the file did not change."""


@dataclasses.dataclass(frozen=True, slots=True)
class Terms:
    """A document's words as the keyword index stores them, flat: chunk i has `sizes[i]`
    (word, count) pairs, pair j being (`words[which[j]]`, `counts[j]`). Flat arrays rather
    than a mapping per chunk: they cross from the reader workers, where words are counted,
    cheaply. `words` holds each of the document's words once (about half its pairs at 1,200
    characters a chunk), so the writer names each word once a document."""

    words: list[str]
    which: npt.NDArray[np.int32]
    counts: npt.NDArray[np.int32]
    sizes: npt.NDArray[np.int64]

    @classmethod
    def of(cls, counted: Iterable[Mapping[str, int]]) -> Terms:
        """Each chunk's word counts, in order, made flat."""
        pairs: list[str] = []
        counts: list[int] = []
        sizes: list[int] = []
        for chunk in counted:
            pairs += chunk.keys()
            counts += chunk.values()
            sizes.append(len(chunk))
        words = list(dict.fromkeys(pairs))
        at = {w: i for i, w in enumerate(words)}
        which = np.fromiter(map(at.__getitem__, pairs), np.int32, len(pairs))
        return cls(words, which, np.array(counts, dtype=np.int32), np.array(sizes, dtype=np.int64))

    def __reduce__(self) -> tuple[object, ...]:
        """Pickled with its words as one string (a word never holds a newline): a string
        per word took as long to pickle and unpickle as counting the words did."""
        return _joined_terms, ("\n".join(self.words), self.which, self.counts, self.sizes)


def _joined_terms(
    joined: str,
    which: npt.NDArray[np.int32],
    counts: npt.NDArray[np.int32],
    sizes: npt.NDArray[np.int64],
) -> Terms:
    return Terms(joined.split("\n") if joined else [], which, counts, sizes)


class StoredChunk(Protocol):
    """What the store keeps of a chunk besides its words and vector (`documents.Chunk`)."""

    @property
    def page(self) -> int | None: ...
    @property
    def line(self) -> int | None: ...
    @property
    def text(self) -> str: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Stored:
    """A document as written: its record, and its chunks as columns."""

    record: FileRecord
    chunks: Sequence[StoredChunk]
    headings: list[str]
    """Each chunk's headings as stored (JSON)."""
    terms: Terms
    vectors: npt.NDArray[np.float32] | None
    """Unit vectors, a row a chunk; None: the embedding model did not answer."""


@dataclasses.dataclass(frozen=True, slots=True)
class Written:
    """What the store gave a document: its file id, its first chunk's id (the others
    follow), and its chunks' term ids, flat as in its `Terms`."""

    file_id: int
    first_id: int
    term_ids: npt.NDArray[np.int32]


@dataclasses.dataclass(frozen=True, slots=True)
class ChunkBatch:
    """Chunks as loaded for search, as columns: everything but their text.

    The word counts are flat: `sizes[i]` (term id, count) pairs belong to chunk i.
    """

    ids: npt.NDArray[np.int64]
    file_ids: npt.NDArray[np.int64]
    headings: list[str]
    """Each chunk's headings as stored (JSON): equal strings, equal headings."""
    pages: npt.NDArray[np.int32]
    lines: npt.NDArray[np.int32]
    term_ids: npt.NDArray[np.int32]
    counts: npt.NDArray[np.int32]
    sizes: npt.NDArray[np.int64]
    vectors: npt.NDArray[np.float32]
    has_vector: npt.NDArray[np.bool_]


def _select_words(db: sqlite3.Connection, words: set[str]) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    ordered = sorted(words)
    for i in range(0, len(ordered), 500):
        part = ordered[i : i + 500]
        marks = ",".join("?" * len(part))
        found += db.execute(f"SELECT word, id FROM terms WHERE word IN ({marks})", part).fetchall()
    return found


def _upsert_meta(db: sqlite3.Connection, values: dict[str, str]) -> None:
    db.executemany(
        "INSERT INTO meta (key, value) VALUES (?, ?) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        sorted(values.items()),
    )


def _terms_blob(term_ids: npt.NDArray[np.int32], counts: npt.NDArray[np.int32]) -> bytes:
    return np.concatenate([term_ids, counts]).astype("<i4").tobytes()


def _terms_blobs(
    term_ids: npt.NDArray[np.int32], counts: npt.NDArray[np.int32], sizes: npt.NDArray[np.int64]
) -> list[bytes]:
    """Each chunk's `_terms_blob`, for a document's flat columns, laid out in one array
    (a few array operations a document rather than a few a chunk)."""
    ends = np.cumsum(sizes)
    starts = ends - sizes
    owner = np.repeat(np.arange(len(sizes)), sizes)
    at = starts[owner] + np.arange(len(term_ids))  # chunk k's ids from 2 × its start
    laid = np.empty(2 * len(term_ids), dtype="<i4")
    laid[at] = term_ids
    laid[at + sizes[owner]] = counts
    raw = laid.tobytes()
    return [raw[8 * a : 8 * b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]


class StoreUnavailable(Exception):
    """The index cannot be opened where it is (a folder not writable, a missing mount):
    the message names the path, since the fix is there, not in the index."""


Trouble = Literal["full", "damaged"]


def trouble(e: BaseException) -> Trouble | None:
    """What an error says of the index itself rather than of the document being written:
    a full drive (wait for space), or a damaged file (rebuild it from the sources)."""
    if not isinstance(e, sqlite3.DatabaseError):
        return None
    code = getattr(e, "sqlite_errorcode", None)
    text = str(e).lower()
    if code == sqlite3.SQLITE_FULL or "disk is full" in text:
        return "full"
    if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB) or any(
        words in text for words in ("malformed", "not a database", "database corrupt")
    ):
        return "damaged"
    return None


def free_megabytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free // 1_000_000


class IndexTooNew(StoreUnavailable):
    """The index was written in a format newer than `INDEX_FORMAT`: the base waits, saying
    so, and nothing of the index is changed."""


def newer_format(recorded: str | None) -> str | None:
    """Why an index whose meta records `recorded` as its format cannot be read here; None
    when it can (a format up to `INDEX_FORMAT`, or none recorded yet)."""
    if recorded is None:
        return None
    if not recorded.isdigit():
        return f"its format {recorded!r} is not one this indexer knows"
    if int(recorded) > INDEX_FORMAT:
        return (
            f"it was written in format {int(recorded)} by a newer indexer, and this one reads "
            f"format {INDEX_FORMAT} at most: run the newer image again (nothing was changed)"
        )
    return None


class IndexDamaged(sqlite3.DatabaseError):
    """SQLite's integrity check found the file damaged."""


SWEEP_ROWS = 256
"""Rows of each table and entries of each index the integrity check reads a look: a few
MB at most (chunks with their texts, words and vectors)."""

SWEEPS: tuple[tuple[str, str, int], ...] = (
    (
        "chunks",
        "SELECT id, file_id, ord, headings, page, line, text, terms, vector "
        "FROM chunks WHERE id > ? ORDER BY id LIMIT ?",
        1,
    ),
    (
        "chunks_by_file",
        "SELECT file_id, id FROM chunks INDEXED BY chunks_by_file "
        "WHERE (file_id, id) > (?, ?) ORDER BY file_id, id LIMIT ?",
        2,
    ),
    ("terms", "SELECT id, word FROM terms WHERE id > ? ORDER BY id LIMIT ?", 1),
    (
        "staged",
        "SELECT chunk_id, vector FROM staged WHERE chunk_id > ? ORDER BY chunk_id LIMIT ?",
        1,
    ),
    (
        "terms by word",
        "SELECT word FROM terms INDEXED BY sqlite_autoindex_terms_1 "
        "WHERE word > ? ORDER BY word LIMIT ?",
        1,
    ),
    ("files", "SELECT id, * FROM files WHERE id > ? ORDER BY id LIMIT ?", 1),
    (
        "files by path",
        "SELECT source, path FROM files INDEXED BY sqlite_autoindex_files_1 "
        "WHERE (source, path) > (?, ?) ORDER BY source, path LIMIT ?",
        2,
    ),
)
"""What the integrity check walks, each in the order of its own B-tree (so a look reads
its next pages): the tables by row id, each index by its key. A statement's first
columns are its key; `?`s before LIMIT take the key where the last look stopped."""

_SWEEP_START: dict[int, tuple[object, ...]] = {1: (-1,), 2: (-1, -1)}
"""Keys below every real one: ids are never negative, and SQLite orders any number before
any text."""


class Checkpointer:
    """Copies the write-ahead log into the database on a thread and connection of its own.

    A checkpoint writes the log's pages into the database and waits for the disk
    (fsync): ~0.1-0.5 s for 64 MB here, 3.4 s of the 19 s of writing 100,000 chunks when
    the writer did it. Passive, it never blocks the writer or a reader; pages a reader
    still sees, or written meanwhile, are copied by the next one.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self._due = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def ask(self) -> None:
        """A checkpoint soon (one at a time; asking again meanwhile asks for one more)."""
        with self._lock:
            if self._thread is None:
                self._stopping = False
                self._thread = threading.Thread(
                    target=self._run, name="sqlite-checkpoint", daemon=True
                )
                self._thread.start()
        self._due.set()

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._stopping = True
        if thread is not None:
            self._due.set()
            thread.join()

    def _run(self) -> None:
        conn = self._connect()
        try:
            while True:
                self._due.wait()
                self._due.clear()
                if self._stopping:
                    return
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as e:  # the writer meets a full or damaged file too
                    log.warning("copying the index's log into its database failed: %s", e)
        finally:
            conn.close()


class Store:
    """SQLite access. One writer connection; readers get a connection per thread.

    The file is opened on first use, so a damaged or unreachable index is an error
    the indexer can handle where it loads, not one its construction raises.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / "index.sqlite3"
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._open_lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._word_cache: dict[str, int] = {}
        self._unknown: dict[str, int] = {}
        """Words no chunk had, with the generation of words they were looked up in."""
        self._words_generation = 0
        self._written_words: dict[str, int] = {}
        """Ids of words on disk (or in the transaction being written), for the writer only."""
        self._every_word: bool | None = None
        """Whether `_written_words` holds every word on disk (None: not written yet)."""
        self._wal = self.path.with_name(self.path.name + "-wal")
        self._checkpointer = Checkpointer(self._connect)
        self._swept: dict[str, tuple[object, ...]] = {}
        """Where the integrity check's last look stopped, by what it walks (`SWEEPS`)."""
        self._retired = False
        """Whether another index answers in its place: its files are removed, and opening
        it again would make an empty one there."""

    @property
    def _writer(self) -> sqlite3.Connection:
        return self._conn or self.open()

    def open(self) -> sqlite3.Connection:
        """The writer connection, with the schema in place; StoreUnavailable naming the
        path when the folder cannot hold it."""
        with self._open_lock:
            if self._conn is not None:
                return self._conn
            if self._retired:
                raise StoreUnavailable(f"the index {self.path} was replaced by another")
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                conn = self._connect()
            except (OSError, sqlite3.OperationalError) as e:
                raise StoreUnavailable(self._why_not(e)) from None
            conn.execute(f"PRAGMA cache_size = -{WRITER_CACHE_KIB}")
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # the checkpointer's work
            conn.execute("PRAGMA journal_size_limit = 0")  # a log started over is emptied
            self._refuse_newer(conn)
            with conn:
                conn.executescript(SCHEMA)
                conn.execute(
                    "INSERT OR IGNORE INTO meta VALUES ('format', ?)", (str(INDEX_FORMAT),)
                )
                columns = {row[1] for row in conn.execute("PRAGMA table_info(files)")}
                if "built_with" not in columns:  # an index written before files recorded it
                    conn.execute("ALTER TABLE files ADD COLUMN built_with TEXT NOT NULL DEFAULT ''")
            self._conn = conn
            return conn

    def _refuse_newer(self, conn: sqlite3.Connection) -> None:
        """IndexTooNew, before anything is written, for an index of a newer format."""
        has_meta = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        row = has_meta and conn.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        why = newer_format(row[0] if row else None)
        if why is not None:
            conn.close()
            raise IndexTooNew(f"cannot open the index {self.path}: {why}")

    def _why_not(self, e: BaseException) -> str:
        what = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        if self.folder.is_dir() and not os.access(self.folder, os.W_OK | os.X_OK):
            what = "the folder is not writable"
        return f"cannot open the index {self.path}: {what}"

    def check(self) -> None:
        """SQLite's quick check (structure, not every index entry): IndexDamaged when the
        file is damaged. Seconds for a large index, once at start."""
        with self._write_lock:
            rows = self._writer.execute("PRAGMA quick_check").fetchall()
        if [r[0] for r in rows] != ["ok"]:
            raise IndexDamaged(f"database disk image is malformed: {rows[0][0]}")

    def sweep(self, rows: int = SWEEP_ROWS) -> None:
        """Reads the next `rows` rows of every table and index, whole, from where the last
        look stopped, starting over after the last: damage on a page that no search reads
        is met within `pages / rows` looks, at a few MB a look. Raises what SQLite raises
        for a damaged page (`trouble` says "damaged")."""
        db = self._reader
        for name, sql, width in SWEEPS:
            after = self._swept.get(name, _SWEEP_START[width])
            found = db.execute(sql, (*after, rows)).fetchall()
            self._swept[name] = (
                tuple(found[-1][:width]) if len(found) == rows else _SWEEP_START[width]
            )

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
        except BaseException:
            conn.close()
            raise
        return conn

    @property
    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            self.open()  # the schema exists before anything reads
            conn = self._local.conn = self._connect()
        return conn

    def close(self) -> None:
        """Closes the writer, once no write runs on it, and lets go of the readers: each
        thread's reader closes when nothing holds it, so never under a search still reading
        from it (a connection closed while another thread runs a statement on it is a crash
        inside SQLite). What asks afterwards opens it again, or, once retired, is refused
        (`StoreUnavailable`)."""
        self._checkpointer.stop()
        with self._write_lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        self._local = threading.local()

    def retire(self) -> None:
        """Closes it for good: another index answers in its place."""
        with self._open_lock:
            self._retired = True
        self.close()

    def move_aside(self, folder: Path) -> Path:
        """Moves a damaged index into `folder` under `DAMAGED_SUFFIX`, for a person to look
        at (retiring it first: a search still reading it reads the moved file, or is
        refused); where it went."""
        self.retire()
        aside = folder / (self.path.name + DAMAGED_SUFFIX)
        for suffix in ("", "-wal", "-shm"):
            part = self.path.with_name(self.path.name + suffix)
            target = aside.with_name(aside.name + suffix)
            if part.exists():
                os.replace(part, target)
            else:
                target.unlink(missing_ok=True)
        return aside

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction. SQLite may already have rolled back (a full disk does),
        so rolling back is only asked of a transaction still open."""
        with self._write_lock:
            db = self._writer
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            self._written()

    def _written(self) -> None:
        """After a write: has the checkpointer copy the log into the database once it holds
        `CHECKPOINT_BYTES` (until the log starts over and is emptied, on the first write
        after a checkpoint that copied it all: `journal_size_limit`)."""
        try:
            size = self._wal.stat().st_size
        except FileNotFoundError:
            return
        if size >= CHECKPOINT_BYTES:
            self._checkpointer.ask()

    # -- settings the index was built with -------------------------------------------------

    def meta(self) -> dict[str, str]:
        return dict(self._reader.execute("SELECT key, value FROM meta").fetchall())

    def set_meta(self, values: dict[str, str]) -> None:
        with self._transaction() as db:
            _upsert_meta(db, values)

    def drop_vectors(self) -> None:
        """Forget every vector (another embedding model's); the chunks stay searchable by
        words until their documents are read again."""
        with self._write_lock:
            self._writer.execute("UPDATE chunks SET vector = NULL WHERE vector IS NOT NULL")
            self._written()

    # -- a new embedding model's vectors, made beside the ones that answer -----------------

    def begin_staging(self, meta: dict[str, str]) -> None:
        """Start making another model's vectors: none staged yet, and `meta` says which."""
        with self._transaction() as db:
            db.execute("DELETE FROM staged")
            _upsert_meta(db, meta)

    def end_staging(self, key: str) -> None:
        """Forget the vectors being made (the model they were for is no longer wanted) and
        the meta `key` that named it."""
        with self._transaction() as db:
            db.execute("DELETE FROM staged")
            db.execute("DELETE FROM meta WHERE key = ?", (key,))

    def lacking_staged(
        self, after: int, limit: int
    ) -> list[tuple[int, str | None, tuple[str, ...], str]]:
        """Up to `limit` chunks past id `after` that have no staged vector, in id order, with
        what their passage is made of: their file's title, their headings and text."""
        rows = self._reader.execute(
            "SELECT chunks.id, files.title, chunks.headings, chunks.text FROM chunks"
            " JOIN files ON files.id = chunks.file_id WHERE chunks.id > ?"
            " AND NOT EXISTS (SELECT 1 FROM staged WHERE staged.chunk_id = chunks.id)"
            " ORDER BY chunks.id LIMIT ?",
            (after, limit),
        ).fetchall()
        return [(i, title, tuple(json.loads(h)), text) for i, title, h, text in rows]

    def put_staged(
        self, ids: Sequence[int], vectors: Sequence[npt.NDArray[np.float32] | None]
    ) -> None:
        """Staged vectors of chunks (by id), in one transaction; None: the model refused the
        chunk. A chunk dropped meanwhile is left out."""
        rows = [
            (i, None if v is None else np.asarray(v, dtype="<f4").tobytes(), i)
            for i, v in zip(ids, vectors, strict=True)
        ]
        with self._transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO staged (chunk_id, vector)"
                " SELECT ?, ? WHERE EXISTS (SELECT 1 FROM chunks WHERE id = ?)",
                rows,
            )

    def staged_counts(self) -> tuple[int, int]:
        """Chunks with a staged vector, and all the chunks."""
        db = self._reader
        done = int(db.execute("SELECT COUNT(*) FROM staged").fetchone()[0])
        return done, int(db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0])

    def database_bytes(self) -> int:
        """The database's size (its pages, free ones too)."""
        db = self._reader
        pages = int(db.execute("PRAGMA page_count").fetchone()[0])
        return pages * int(db.execute("PRAGMA page_size").fetchone()[0])

    def switch_vectors(
        self, meta: dict[str, str], forget: Sequence[str], built_with: tuple[str, str]
    ) -> list[int] | None:
        """The staged vectors become the chunks' vectors, in one transaction with the meta
        that says so (`meta` set, `forget` deleted). Indexed files recorded as built with
        `built_with[0]` are recorded as built with `built_with[1]` (their ids are returned),
        but for those with a chunk the new model refused: they are read again, as a fresh
        pass would fail them. None, and nothing changed, when a chunk still lacks a staged
        vector."""
        old_key, new_key = built_with
        with self._transaction() as db:
            lacking = db.execute(
                "SELECT COUNT(*) FROM chunks"
                " WHERE NOT EXISTS (SELECT 1 FROM staged WHERE staged.chunk_id = chunks.id)"
            ).fetchone()[0]
            if lacking:
                return None
            db.execute(
                "UPDATE chunks SET vector = (SELECT vector FROM staged"
                " WHERE staged.chunk_id = chunks.id)"
            )
            rebuilt = db.execute(
                "UPDATE files SET built_with = ? WHERE built_with = ? AND state = 'indexed'"
                " AND id NOT IN (SELECT chunks.file_id FROM chunks JOIN staged"
                " ON staged.chunk_id = chunks.id WHERE staged.vector IS NULL) RETURNING id",
                (new_key, old_key),
            ).fetchall()
            db.execute("DELETE FROM staged")
            _upsert_meta(db, meta)
            db.executemany("DELETE FROM meta WHERE key = ?", [(k,) for k in forget])
        return [int(i) for (i,) in rebuilt]

    def chunk_vectors(
        self, dimensions: int, batch: int = 8192
    ) -> Iterator[tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.bool_]]]:
        """Every chunk's id and vector (zeros where it has none of `dimensions`), and which
        have one, in id order, a batch at a time."""
        cur = self._reader.execute("SELECT id, vector FROM chunks ORDER BY id")
        while rows := cur.fetchmany(batch):
            ids, vectors = zip(*rows, strict=True)
            present = np.array([v is not None and len(v) == 4 * dimensions for v in vectors])
            matrix = np.zeros((len(rows), dimensions), dtype=np.float32)
            if present.any():
                raw = b"".join(v for v, ok in zip(vectors, present, strict=True) if ok)
                matrix[present] = np.frombuffer(raw, dtype="<f4").reshape(-1, dimensions)
            yield np.array(ids, dtype=np.int64), matrix, present

    # -- files -----------------------------------------------------------------------------

    def files(self) -> list[tuple[int, FileRecord]]:
        rows = self._reader.execute(
            "SELECT id, source, path, kind, size, mtime_ns, hash, state, indexed_at, reason,"
            " detail, title, chunks, built_with FROM files ORDER BY id"
        ).fetchall()
        return [(r[0], FileRecord(*r[1:])) for r in rows]

    def put_documents(self, documents: Sequence[Stored]) -> list[Written | Exception]:
        """Replace several files' records and chunks in one transaction, each document in a
        savepoint of its own: whole or not at all. A document that cannot be stored is
        given back as its error and the others are written; an error of the index itself
        (a full drive, a damaged file) is raised and writes none.

        One commit for several documents is what makes a pass's writes cheap; a kill
        loses the documents of the transaction in flight, which the next pass reads again.
        Words get their ids in the same savepoint as the chunks that use them, so the
        words on disk always cover the term ids of the chunks on disk.
        """
        results: list[Written | Exception] = []
        words = self._written_words
        added: list[str] = []
        """Words this transaction gave ids: forgotten again if it does not commit."""
        try:
            with self._transaction() as db:
                self._know_words(db)
                next_id = int(
                    db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM chunks").fetchone()[0]
                )
                for document in documents:
                    db.execute("SAVEPOINT document")
                    mark = len(added)
                    try:
                        results.append(self._write(db, document, next_id, added))
                        db.execute("RELEASE document")
                    except (sqlite3.Error, ValueError) as e:
                        if trouble(e) is not None or not db.in_transaction:
                            raise
                        db.execute("ROLLBACK TO document")
                        db.execute("RELEASE document")
                        for w in added[mark:]:
                            del words[w]
                        del added[mark:]
                        results.append(e)
                        continue
                    next_id += len(document.chunks)
        except BaseException:
            for w in added:
                words.pop(w, None)  # the words may have been forgotten meanwhile
            raise
        if added:  # after the commit: a question's lookup from now on sees them
            self._words_generation += 1
        return results

    def _write(
        self, db: sqlite3.Connection, document: Stored, first_id: int, added: list[str]
    ) -> Written:
        """One document's rows; its chunks take ids from `first_id` on, and the words it
        brings get ids (and are listed in `added`)."""
        ids = self._written_words
        terms = document.terms
        missing = set(terms.words).difference(ids)
        if missing:
            found, new = self._word_ids(db, missing, all_new=bool(self._every_word))
            ids.update(found)
            added += new
        named = np.fromiter(map(ids.__getitem__, terms.words), np.int32, len(terms.words))
        term_ids = named[terms.which]
        file_id = self._upsert_file(db, document.record)
        db.execute("DELETE FROM chunks WHERE file_id = ?", (file_id,))
        n = len(document.chunks)
        blobs = _terms_blobs(term_ids, terms.counts, terms.sizes)
        vectors: Sequence[bytes | None] = [None] * n
        if document.vectors is not None:
            raw = document.vectors.astype("<f4").tobytes()
            width = 4 * document.vectors.shape[1]
            vectors = [raw[i * width : (i + 1) * width] for i in range(n)]
        db.executemany(
            "INSERT INTO chunks (id, file_id, ord, headings, page, line, text, terms, vector)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (first_id + ord_, file_id, ord_, headings, c.page, c.line, c.text, blob, v)
                for ord_, (c, headings, blob, v) in enumerate(
                    zip(document.chunks, document.headings, blobs, vectors, strict=True)
                )
            ],
        )
        return Written(file_id, first_id, term_ids)

    def _know_words(self, db: sqlite3.Connection) -> None:
        """The writer's word ids: on its first write, every word on disk when that many fit
        in `WRITTEN_WORDS`; emptied once they grow past it (words are looked up from then)."""
        words = self._written_words
        if self._every_word is None:
            count = int(db.execute("SELECT COUNT(*) FROM terms").fetchone()[0])
            self._every_word = count <= WRITTEN_WORDS
            if self._every_word:
                words.update(db.execute("SELECT word, id FROM terms"))
        elif len(words) > WRITTEN_WORDS:
            words.clear()
            self._every_word = False

    def forget_written_words(self) -> None:
        """Drop the writer's word ids once a pass is over: they are a pass's working set
        (~26 MB at 100,000 chunks, a quarter KB a chunk against a budget of 5 KB), and the
        next pass's first write reads them again (0.2 s)."""
        with self._write_lock:
            self._written_words.clear()
            self._every_word = None

    @staticmethod
    def _word_ids(
        db: sqlite3.Connection, words: set[str], all_new: bool
    ) -> tuple[dict[str, int], list[str]]:
        """Ids of `words`, giving new words the next free ids; and which were new.
        `all_new`: the caller knows none is on disk, and SQLite is not asked."""
        if not words:
            return {}, []
        ids = {} if all_new else dict(_select_words(db, words))
        new = sorted(words - ids.keys())
        if new:
            start = db.execute("SELECT COALESCE(MAX(id) + 1, 0) FROM terms").fetchone()[0]
            rows = [(start + i, w) for i, w in enumerate(new)]
            db.executemany("INSERT INTO terms (id, word) VALUES (?, ?)", rows)
            ids.update((w, i) for i, w in rows)
        return ids, new

    def word_ids(self, words: Iterable[str]) -> npt.NDArray[np.int32]:
        """Ids of the known words among `words` (an unknown word matches nothing).

        Ids never change until `clear`, so the words of recent questions are kept, and
        so are the words no chunk has until a document brings new words.
        """
        cache, unknown, generation = self._word_cache, self._unknown, self._words_generation
        ids: set[int] = set()
        missing: set[str] = set()
        for w in words:
            i = cache.get(w)
            if i is not None:
                ids.add(i)
            elif unknown.get(w) != generation:
                missing.add(w)
        if missing:
            found = dict(_select_words(self._reader, missing))
            if len(cache) + len(found) > WORD_CACHE:
                cache.clear()
            if len(unknown) > WORD_CACHE:
                unknown.clear()
            cache.update(found)
            unknown.update((w, generation) for w in missing - found.keys())
            ids.update(found.values())
        return np.array(sorted(ids), dtype=np.int32)

    @staticmethod
    def _upsert_file(db: sqlite3.Connection, r: FileRecord) -> int:
        row = db.execute(
            "INSERT INTO files (source, path, kind, size, mtime_ns, hash, state, indexed_at,"
            " reason, detail, title, chunks, built_with)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (source, path) DO UPDATE SET kind = excluded.kind,"
            " size = excluded.size, mtime_ns = excluded.mtime_ns, hash = excluded.hash,"
            " state = excluded.state, indexed_at = excluded.indexed_at,"
            " reason = excluded.reason, detail = excluded.detail, title = excluded.title,"
            " chunks = excluded.chunks, built_with = excluded.built_with RETURNING id",
            (
                r.source,
                r.path,
                r.kind,
                r.size,
                r.mtime_ns,
                r.hash,
                r.state,
                r.indexed_at,
                r.reason,
                r.detail,
                r.title,
                r.chunks,
                r.built_with,
            ),
        ).fetchone()
        return int(row[0])

    def touch_file(self, source: str, path: str, size: int, mtime_ns: int) -> None:
        """Record a new size and mtime for a file whose content hash did not change."""
        with self._write_lock:
            self._writer.execute(
                "UPDATE files SET size = ?, mtime_ns = ? WHERE source = ? AND path = ?",
                (size, mtime_ns, source, path),
            )

    def delete_files(self, keys: Sequence[tuple[str, str]]) -> None:
        with self._transaction() as db:
            db.executemany("DELETE FROM files WHERE source = ? AND path = ?", keys)

    # -- chunks ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def reading(self) -> Iterator[tuple[str, int]]:
        """One read transaction on this thread's connection, so that everything read in it
        is of one moment; yields the database's id and generation at that moment."""
        db = self._reader
        db.execute("BEGIN")
        try:
            row = db.execute("SELECT id, n FROM generation").fetchone()
            yield str(row[0]), int(row[1])
        finally:
            db.execute("COMMIT")

    def chunk_count(self) -> int:
        return int(self._reader.execute("SELECT COUNT(*) FROM chunks").fetchone()[0])

    def load_chunks(self, dimensions: int, batch: int = 8192) -> Iterator[ChunkBatch]:
        """Every chunk, in id order, a batch of columns at a time (no Python object per
        word or vector: loading 100,000 chunks must take seconds)."""
        cur = self._reader.execute(
            "SELECT id, file_id, headings, COALESCE(page, 0), COALESCE(line, 0), terms, vector"
            " FROM chunks ORDER BY id"
        )
        while rows := cur.fetchmany(batch):
            ids, file_ids, headings, pages, lines, terms, vectors = zip(*rows, strict=True)
            flat = np.frombuffer(b"".join(terms), dtype="<i4")
            halves = np.array([len(t) // 8 for t in terms], dtype=np.int64)
            starts = np.repeat(np.cumsum(2 * halves) - 2 * halves, halves)
            within = np.arange(len(starts)) - np.repeat(np.cumsum(halves) - halves, halves)
            has_vector = np.array([v is not None and len(v) == 4 * dimensions for v in vectors])
            matrix = np.zeros((len(rows), dimensions), dtype=np.float32)
            if has_vector.any():
                present = b"".join(v for v, ok in zip(vectors, has_vector, strict=True) if ok)
                matrix[has_vector] = np.frombuffer(present, dtype="<f4").reshape(-1, dimensions)
            yield ChunkBatch(
                ids=np.array(ids, dtype=np.int64),
                file_ids=np.array(file_ids, dtype=np.int64),
                headings=list(headings),
                pages=np.array(pages, dtype=np.int32),
                lines=np.array(lines, dtype=np.int32),
                term_ids=flat[starts + within].astype(np.int32),
                counts=flat[starts + within + np.repeat(halves, halves)].astype(np.int32),
                sizes=halves,
                vectors=matrix,
                has_vector=has_vector,
            )

    def chunk_texts(
        self, batch: int = 8192, after: int = 0
    ) -> Iterator[list[tuple[int, str | None, tuple[str, ...], str]]]:
        """Every chunk's id (past `after`), its file's title, its headings and text (what
        its words are counted from), in id order, a batch at a time; each batch a query of
        its own, so words may be written between batches."""
        while rows := self._reader.execute(
            "SELECT chunks.id, files.title, chunks.headings, chunks.text FROM chunks"
            " JOIN files ON files.id = chunks.file_id WHERE chunks.id > ?"
            " ORDER BY chunks.id LIMIT ?",
            (after, batch),
        ).fetchall():
            yield [(i, title, tuple(json.loads(h)), text) for i, title, h, text in rows]
            after = rows[-1][0]

    def put_words(self, chunks: Sequence[tuple[int, Mapping[str, int]]]) -> None:
        """Replace the word counts of chunks (by id) in one transaction, giving new words
        ids: the words counted again from the chunks' own texts."""
        words = self._written_words
        added: list[str] = []
        try:
            with self._transaction() as db:
                self._know_words(db)
                missing = {w for _, counts in chunks for w in counts if w not in words}
                if missing:
                    found, added = self._word_ids(db, missing, all_new=bool(self._every_word))
                    words.update(found)
                db.executemany(
                    "UPDATE chunks SET terms = ? WHERE id = ?",
                    [
                        (
                            _terms_blob(
                                np.array([words[w] for w in counts], dtype=np.int32),
                                np.array(list(counts.values()), dtype=np.int32),
                            ),
                            i,
                        )
                        for i, counts in chunks
                    ],
                )
        except BaseException:
            for w in added:
                words.pop(w, None)
            raise
        if added:
            self._words_generation += 1

    def last_chunk_id(self) -> int:
        return int(self._reader.execute("SELECT COALESCE(MAX(id), 0) FROM chunks").fetchone()[0])

    def passages(
        self, chunk_ids: Sequence[int]
    ) -> dict[int, tuple[str | None, tuple[str, ...], str, bytes | None]]:
        """Chunks (by id) with what their passage is made of (their file's title, their
        headings and text) and their vector's bytes (None: they have none)."""
        if not chunk_ids:
            return {}
        marks = ",".join("?" * len(chunk_ids))
        rows = self._reader.execute(
            "SELECT chunks.id, files.title, chunks.headings, chunks.text, chunks.vector"
            " FROM chunks JOIN files ON files.id = chunks.file_id"
            f" WHERE chunks.id IN ({marks})",
            list(chunk_ids),
        ).fetchall()
        return {i: (title, tuple(json.loads(h)), text, v) for i, title, h, text, v in rows}

    def texts(self, chunk_ids: Sequence[int]) -> dict[int, str]:
        if not chunk_ids:
            return {}
        marks = ",".join("?" * len(chunk_ids))
        rows = self._reader.execute(
            f"SELECT id, text FROM chunks WHERE id IN ({marks})", list(chunk_ids)
        ).fetchall()
        return dict(rows)
