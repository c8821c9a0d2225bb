"""Dead rows are reclaimed as a base is read again and again (before they were, 30 full
reindexes took a base from 151 to 257 MB, and its dense step from 0.33 to 13 ms)."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from metis_indexer.index import vectors
from metis_indexer.index.memory import (
    MIN_ROWS,
    Index,
    Replacement,
    compaction_capacity,
    grown,
)
from metis_indexer.index.vectors import FloatVectors, allowed_spans
from metis_indexer.limits import VectorKind

from .helpers import chunk, new_index, record

PEPS = Path(__file__).resolve().parents[3].parent / "shared/data/perf/python-peps/peps"
DIM = 16


def paragraphs(n: int) -> list[str]:
    """n paragraphs of real prose (Python PEPs), so postings are those of real text."""
    out: list[str] = []
    for path in sorted(PEPS.glob("pep-*.rst")):
        for para in path.read_text(encoding="utf-8").split("\n\n"):
            para = " ".join(para.split())
            if len(para) > 200:
                out.append(para[:1200])
                if len(out) == n:
                    return out
    raise AssertionError(f"only {len(out)} paragraphs in {PEPS}")


def base(n_docs: int = 120, per_doc: int = 10) -> list[Replacement]:
    """A base of 1,200 chunks by default: more than `MIN_ROWS`, so that a full reindex
    reaches the write path's compaction."""
    texts = paragraphs(n_docs * per_doc)
    rng = np.random.default_rng(24)
    out: list[Replacement] = []
    for i in range(n_docs):
        parts = texts[i * per_doc : (i + 1) * per_doc]
        chunks = [chunk(t, (f"Part {i % 7}",), line=j + 1) for j, t in enumerate(parts)]
        out.append(
            Replacement(
                record(f"f{i}.md", chunks=per_doc),
                chunks,
                rng.standard_normal((per_doc, DIM)).astype(np.float32),
            )
        )
    return out


def full_reindex(index: Index, documents: list[Replacement]) -> None:
    """Every document written again, a pass's writer's groups at a time, then settled."""
    for at in range(0, len(documents), 32):
        index.put_documents(documents[at : at + 32])
    index.settle()


def loaded(folder: Path, kind: VectorKind) -> Index:
    fresh = Index(folder, kind)
    fresh.load()
    return fresh


def answers(index: Index, questions: list[tuple[str, np.ndarray]]) -> list[object]:
    """What searches find, by chunk id, with the citation of each: rows differ between
    indexes, chunks do not."""
    out: list[object] = []
    for words, vector in questions:
        with index.reading() as read:
            allowed = read.allowed(None)
            legs = [read.dense(vector, allowed, 20), read.by_words(words.split(), None, 20)]
        for leg in legs:
            rows = [r for r, _ in leg]
            out.append(
                [
                    (int(index.row_chunk[r]), round(s, 5), c.record.path, c.line, c.headings)
                    for (r, s), c in zip(leg, index.cited(rows), strict=True)
                ]
            )
    return out


def vector_files(folder: Path) -> list[str]:
    """The int8 holder's files this process holds open (unlinked at once: found by fd)."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own, closed since
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    return [link for link in links if link.startswith(f"{folder}/{vectors.FILE_PREFIX}")]


def questions(n: int = 8) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    words = [
        "python generator expressions",
        "unicode strings",
        "import statement",
        "the standard library",
        "exception handling",
        "keyword arguments",
        "decorator syntax",
        "integer division",
    ]
    vecs = rng.standard_normal((n, DIM)).astype(np.float32)
    return [(words[i % len(words)], v / np.linalg.norm(v)) for i, v in enumerate(vecs)]


# -- the decisions, as plain data --------------------------------------------------------


def test_while_writing_dead_rows_wait_for_a_quarter_and_a_thousand():
    assert compaction_capacity(4000, 999, 4096, idle=False) is None, "a quarter, too few"
    assert compaction_capacity(8000, 1999, 8192, idle=False) is None, "many, not a quarter"
    assert compaction_capacity(8000, 2000, 8192, idle=False) == 9000, "room for a half more"
    assert compaction_capacity(2200, 1100, 4096, idle=False) == 1650


def test_once_idle_a_sixteenth_dead_or_spare_room_is_reclaimed_to_a_fresh_load_s_size():
    assert compaction_capacity(64_000, 3999, 64_000, idle=True) is None
    assert compaction_capacity(64_000, 4000, 64_000, idle=True) == 61_875, "live + 1/32"
    assert compaction_capacity(60_000, 0, 64_000, idle=True) is None, "within a sixteenth"
    assert compaction_capacity(60_000, 0, 96_000, idle=True) == 61_875, "spare room"
    assert compaction_capacity(900, 300, MIN_ROWS, idle=True) is None, "no smaller than this"
    assert compaction_capacity(1100, 300, 2048, idle=True) == MIN_ROWS


def test_rows_double_while_none_is_dead_and_grow_by_less_while_a_pass_replaces_them():
    assert grown(4096, 4097, 0) == 8192
    assert grown(0, 10, 0) == MIN_ROWS
    assert grown(62_000, 62_100, 2000) == 90_150, "room for a half more than the live"
    assert grown(80_000, 80_100, 30_000) == 90_112, "an eighth more than needed at least"


def test_a_dense_scan_reads_only_the_pieces_that_allow_a_row():
    mask = np.zeros(10_000, dtype=bool)
    assert allowed_spans(mask, 1024) == []
    mask[[5, 1030, 5000, 9999]] = True
    assert allowed_spans(mask, 1024) == [(0, 2048), (4096, 5120), (9216, 10_000)]
    assert allowed_spans(np.ones(3000, dtype=bool), 1024) == [(0, 3000)]
    assert allowed_spans(np.zeros(0, dtype=bool), 1024) == []


# -- an index read again and again -------------------------------------------------------


@pytest.mark.parametrize("kind", ["float32", "int8"])
def test_a_hundred_full_reindexes_hold_what_a_fresh_load_of_the_base_holds(tmp_path, kind):
    """Before: each full reindex left every old row dead, and nothing reclaimed them in the
    write path: 101 times the rows after 100, and arrays grown to hold them."""
    documents = base()
    index = new_index(tmp_path, DIM, kind)
    full_reindex(index, documents)
    for _ in range(100):
        full_reindex(index, documents)
    assert len(vector_files(tmp_path)) == (2 if kind == "int8" else 0), "the old ones closed"
    fresh = loaded(tmp_path, kind)
    live = 1200
    assert index.chunk_count == fresh.chunk_count == live
    assert index.n_rows == live and index.dead == 0, "every dead row was reclaimed"

    def within(ours: int, theirs: int) -> bool:
        return theirs <= ours <= theirs * 1.1

    assert within(len(index.alive), len(fresh.alive)), "row arrays"
    assert within(len(index.keyword.lengths), len(fresh.keyword.lengths)), "keyword rows"
    assert within(index.vectors.resident_bytes(), fresh.vectors.resident_bytes()), "vectors"
    postings = [sum(len(s.rows) for s in ix.keyword.segments) for ix in (index, fresh)]
    assert postings[0] == postings[1], "no dead row's postings are kept"
    assert index.headings == fresh.headings
    assert answers(index, questions()) == answers(fresh, questions())


def test_dead_rows_waiting_for_compaction_are_passed_over_and_never_answered(tmp_path, monkeypatch):
    """Fewer dead rows than a compaction waits for (under a quarter): the dense scan passes
    over the pieces that hold only them (before, it read every row), and answers what a
    fresh load of the same base answers, either way vectors are held. What int8's scan
    reads is seen where it keeps each piece's best."""
    documents = base(n_docs=500)
    held: dict[VectorKind, Index] = {}
    for kind in ("float32", "int8"):
        held[kind] = index = new_index(tmp_path / kind, DIM, kind)
        full_reindex(index, documents)
        index.put_documents(documents[:110])
        assert index.dead == 1100 and index.n_rows == 6100, "nothing was compacted yet"
    scanned: list[int] = []
    add = vectors.Best.add

    def counted(self: vectors.Best, at: int, scores: np.ndarray, mask: np.ndarray) -> None:
        scanned.append(len(scores))
        add(self, at, scores, mask)

    monkeypatch.setattr(vectors.Best, "add", counted)
    ours = answers(held["int8"], questions())
    per_question = sum(scanned) / len(questions())
    assert 0 < per_question <= 6100 - 1024, "the first 1,024 rows, all dead, were not read"
    for kind, index in held.items():
        assert answers(index, questions()) == answers(loaded(tmp_path / kind, kind), questions())
    assert ours == answers(held["float32"], questions())


def test_a_search_is_answered_while_a_compaction_builds_its_arrays(tmp_path, monkeypatch):
    """Before: a compaction held the index's lock from start to end, and searches waited
    for it (seconds at a million chunks). Now it builds new arrays while searches read the
    old ones. Its copy of the vectors is held here until a search has been answered, or
    the search has waited a minute."""
    documents = base()
    index = new_index(tmp_path, DIM)
    full_reindex(index, documents)
    compacting, searched, release = threading.Event(), threading.Event(), threading.Event()
    keep = FloatVectors.keep

    def keep_once_searched(self: FloatVectors, *args: object, **kw: object) -> None:
        compacting.set()
        release.wait(600)
        keep(self, *args, **kw)

    monkeypatch.setattr(FloatVectors, "keep", keep_once_searched)
    gone = [("docs", f"f{i}.md") for i in range(110)]  # 1,100 of 1,200 rows dead
    writer = threading.Thread(target=index.drop_files, args=(gone,))
    answered: list[int] = []

    def search() -> None:
        [(_, vector)] = questions(1)
        with index.reading() as read:
            answered.extend(r for r, _ in read.dense(vector, read.allowed(None), 5))
        searched.set()

    asker = threading.Thread(target=search)
    writer.start()
    try:
        assert compacting.wait(120), "the drop compacted the rows"
        asker.start()
        asker.join(60)
        during = searched.is_set()
    finally:
        release.set()
        writer.join(120)
        asker.join(120)
    assert during, "the search was answered while the compaction built its arrays"
    assert len(answered) == 5 and index.n_rows == 100 and index.dead == 0


def test_rows_a_search_ranked_keep_their_citations_and_texts_through_a_compaction(tmp_path):
    """A search ranks rows under the lock, then reranks and builds its answer after it:
    the rows it ranked are of the arrays it read, even where a compaction moved them
    meanwhile. (Rows of documents replaced meanwhile have no text: not asked here.)"""
    documents = base()
    index = new_index(tmp_path, DIM)
    full_reindex(index, documents)
    index.put_documents(documents[:90])  # 900 dead rows: f90-f119 first, then f0-f89
    kept = {fid for fid, f in index.files.items() if f.record.path >= "f3"}
    with index.reading() as read:
        allowed = read.allowed(None) & np.isin(index.row_file[: index.n_rows], list(kept))
        rows = [r for r, _ in read.by_words(["unicode", "string"], allowed, 10)]
    assert len(rows) == 10
    want = [(c.record.path, c.line) for c in index.cited(rows)]
    texts = index.texts(rows)
    index.put_documents(documents[:30])  # 1,200 of 2,400 rows dead: compacted
    assert index.dead == 0 and index.n_rows == 1200
    now = [int(index.row_chunk[r]) if r < index.n_rows else None for r in rows]
    assert now != read.row_chunk[rows].tolist(), "the chunks ranked are at other rows now"
    assert [(c.record.path, c.line) for c in read.cited(rows)] == want
    assert read.texts(rows) == texts


def test_the_int8_scan_skips_blocks_of_no_allowed_row(tmp_path):
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((200, 8)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    held = vectors.Int8Vectors(8, tmp_path, block=64)
    held.ensure_capacity(200, 0)
    held.put(0, rows)
    mask = np.zeros(200, dtype=bool)
    mask[[70, 199]] = True
    seen: list[tuple[int, int]] = []
    held._scan(rows[0], 200, lambda _s, at, scores: seen.append((at, len(scores))), mask)
    assert sorted(seen) == [(64, 64), (192, 8)], "the second block and the tail alone"
