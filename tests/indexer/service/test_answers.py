"""What the API asks of an indexer, answered (`metis_indexer.service.answers`): searches
from the index the passes keep, counted by how they were answered; damage a search meets a
503 told to the passes, which rebuild the index; an index replaced under a search a 503 to
ask again; documents paged in order and filtered by state; a pass asked for told to the
passes; evaluation sets looked for where the sources lie. (What a search says before
anything is indexed, from a whole indexer: test_empty_sources.py.)

`Answers` reads the passes through `answers.Answered`; here it is given `View`: a real index
and the real parts of `service.passes.Passes` beside it, loaded as the test says."""

import asyncio
import contextlib
import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from metis_indexer.changes.chunking_change import ChunkingChange
from metis_indexer.changes.model_change import ModelChange
from metis_indexer.changes.vectors import Vectors
from metis_indexer.config import IndexerConfig, SourceConfig
from metis_indexer.configured import Configured
from metis_indexer.errors import BadRequest, Unavailable
from metis_indexer.index.memory import Index, IndexSettings
from metis_indexer.metrics import Metrics
from metis_indexer.schema import SearchRequest
from metis_indexer.service.answers import Answers, evaluation_places
from metis_indexer.service.model_watch import ModelWatch
from metis_indexer.service.notebook import Notebook
from metis_indexer.service.passes import Passes
from metis_indexer.service.progress import Progress
from tests.indexer.index.helpers import chunk, record
from tests.indexer.service.test_live_damage import damage_chunk_pages


@dataclasses.dataclass
class View:
    """What the answers read of the passes (`answers.Answered`): a real index and the real
    parts of `Passes` beside it, loaded as the test says; what the answers tell the passes
    (a pass asked for, damage met) is kept to be looked at."""

    index: Index
    notebook: Notebook
    vectors: Vectors
    model_change: ModelChange
    chunking_change: ChunkingChange
    loaded: bool = True
    passed: bool = True
    chunks_of: tuple[int, int] | None = (1200, 200)
    damage: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    requested: list[bool] = dataclasses.field(default_factory=list)
    damage_met: list[tuple[str, Index]] = dataclasses.field(default_factory=list)

    def request(self, full: bool = False) -> None:
        self.requested.append(full)

    def damaged(self, error: sqlite3.DatabaseError, found_by: str, index: Index) -> None:
        self.damage_met.append((found_by, index))
        self.damage = f"the index is damaged ({error})"


PAGES = {
    "handbook/leave.md": "Every employee gets twenty-five vacation days a year.",
    "handbook/travel.md": "Trains are booked rather than flights under six hours.",
    "guides/setup.md": "Install the client and sign in with the company account.",
}


@contextlib.contextmanager
def answering(tmp_path: Path, pages: dict[str, str] = PAGES) -> Iterator[tuple[Answers, View]]:
    """`Answers` as `service.Indexer` makes it, over `View` of an index holding `pages`
    (keyword-only: no model) and one page that failed to read."""
    config = IndexerConfig(
        name="team",
        sources=[SourceConfig(drive="docs", root=tmp_path / "drive")],
        index_dir=tmp_path / "index",
        workers=1,
    )
    configured = Configured(config)
    metrics = Metrics.create()
    made: list[Passes] = []
    progress = Progress(metrics, lambda: made[0].index.totals(), None)
    passes = Passes(configured, progress, ModelWatch(configured, progress), metrics)
    made.append(passes)
    index = passes.index
    index.adopt(IndexSettings("", 0, 1200, 200))
    for path, text in pages.items():
        index.put_document(record(path, title=path), [chunk(text * 40)], None)
    failed = record("scans/broken.pdf", kind="pdf", chunks=0)
    index.put_document(
        dataclasses.replace(failed, state="failed", reason="malformed", detail="no pages"), [], None
    )
    view = View(index, passes.notebook, passes.vectors, passes.model_change, passes.chunking_change)
    try:
        yield Answers(configured, progress, view, metrics), view
    finally:
        index.writes_done()
        index.store.close()


def test_a_search_is_answered_from_the_index_and_counted_as_answered(tmp_path):
    with answering(tmp_path) as (answers, _):
        answer = asyncio.run(answers.search(SearchRequest(query="vacation days", mode="keyword")))
        searches = answers.status().searches
    assert [r.citation.document for r in answer.results] == ["handbook/leave.md"]
    assert (searches.answered, searches.failed) == (1, 0)


def test_a_search_before_the_index_loads_is_counted_failed(tmp_path):
    with answering(tmp_path) as (answers, view):
        view.loaded = False
        with pytest.raises(Unavailable) as e:
            asyncio.run(answers.search(SearchRequest(query="vacation")))
        searches = answers.status().searches
    assert e.value.code == "KNOWLEDGE_BASE_NOT_READY"
    assert (searches.answered, searches.failed) == (0, 1)
    assert searches.reason is not None and "not serving yet" in searches.reason


def test_damage_a_search_meets_is_a_503_and_told_to_the_passes(tmp_path):
    with answering(tmp_path) as (answers, view):
        view.index.writes_done()
        damage_chunk_pages(view.index.store.path)
        with pytest.raises(Unavailable) as e:
            asyncio.run(answers.search(SearchRequest(query="vacation days", mode="keyword")))
        status = answers.status()
    assert e.value.code == "KNOWLEDGE_BASE_NOT_READY"
    assert "the index is damaged" in e.value.message and "being rebuilt" in e.value.message
    assert view.damage_met == [("search", view.index)]
    assert view.damage in status.warnings
    assert status.searches.failed == 1


def test_an_index_another_has_taken_the_place_of_is_a_503_to_ask_again(tmp_path):
    with answering(tmp_path) as (answers, view):
        view.index.store.retire()
        with pytest.raises(Unavailable) as e:
            asyncio.run(answers.search(SearchRequest(query="vacation days", mode="keyword")))
    assert "could not be read just now" in e.value.message and "ask again" in e.value.message
    assert view.damage_met == []  # not damage: nothing is rebuilt


def test_documents_are_paged_in_order_of_source_and_path_and_filtered_by_state(tmp_path):
    with answering(tmp_path) as (answers, _):
        first, second = answers.documents(1, 3, None), answers.documents(2, 3, None)
        failed = answers.documents(1, 10, "failed")
    assert [d.document for d in first.documents] == [
        "guides/setup.md",
        "handbook/leave.md",
        "handbook/travel.md",
    ]
    assert [d.document for d in second.documents] == ["scans/broken.pdf"]
    assert first.total == second.total == 4
    [broken] = failed.documents
    assert (broken.state, broken.reason, failed.total) == ("failed", "malformed", 1)


@pytest.mark.parametrize(
    ("page", "page_size", "state", "says"),
    [
        (0, 10, None, "pages count from 1"),
        (1, 0, None, "1 to 1000"),
        (1, 1001, None, "1 to 1000"),
        (1, 10, "gone", "indexed, failed"),
    ],
)
def test_a_documents_page_out_of_bounds_is_refused(tmp_path, page, page_size, state, says):
    with answering(tmp_path) as (answers, _), pytest.raises(BadRequest) as e:
        answers.documents(page, page_size, state)
    assert e.value.code == "INVALID_BODY" and says in e.value.message


def test_a_pass_asked_for_through_the_api_is_told_to_the_passes(tmp_path):
    with answering(tmp_path) as (answers, view):
        answers.request_pass()
        answers.request_pass(full=True)
    assert view.requested == [False, True]


def test_evaluation_sets_are_looked_for_at_each_drive_and_each_folder_read_once(tmp_path):
    sources = [
        SourceConfig(drive="docs", root=tmp_path / "docs", path="handbook"),
        SourceConfig(drive="docs", root=tmp_path / "docs", path="guides"),
        SourceConfig(drive="wiki", root=tmp_path / "wiki"),
    ]
    assert evaluation_places(sources) == [
        ("docs", tmp_path / "docs"),
        ("docs/guides", tmp_path / "docs" / "guides"),
        ("docs/handbook", tmp_path / "docs" / "handbook"),
        ("wiki", tmp_path / "wiki"),
    ]
