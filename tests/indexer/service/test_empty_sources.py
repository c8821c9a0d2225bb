"""What a search says before anything is indexed, from a real indexer over a source that holds
no document Metis reads: KNOWLEDGE_BASE_NOT_READY before its index loads, then the two
"nothing is indexed" warnings of `metis_indexer.service.answers`, which the search's pure core only
passes on and the indexer chooses from how far its pass got."""

import asyncio
from pathlib import Path

import pytest

from metis_indexer.config import IndexerConfig, SourceConfig
from metis_indexer.errors import Unavailable
from metis_indexer.ingest.runner import PassState
from metis_indexer.schema import SearchAnswer, SearchRequest
from metis_indexer.service.progress import OnProgress
from metis_indexer.service.service import Indexer


def indexer_of_a_picture(tmp_path: Path, on_progress: OnProgress | None = None) -> Indexer:
    drive = tmp_path / "drive"
    (drive / "pictures").mkdir(parents=True)
    (drive / "pictures" / "logo.png").write_bytes(b"\x89PNG")
    config = IndexerConfig(
        sources=[SourceConfig(drive="docs", root=drive)],
        index_dir=tmp_path / "index",
        rescan_seconds=0,
        workers=1,
    )
    return Indexer(config, on_progress=on_progress)


def test_a_search_before_the_index_loads_is_not_ready(tmp_path):
    indexer = indexer_of_a_picture(tmp_path)
    with pytest.raises(Unavailable) as e:
        asyncio.run(indexer.answers.search(SearchRequest(query="anything")))
    assert e.value.code == "KNOWLEDGE_BASE_NOT_READY"
    assert e.value.message == "the index is not serving yet: it is loading"
    indexer.passes.index.store.close()


async def searches_around_the_first_pass(tmp_path: Path) -> tuple[list[str], SearchAnswer]:
    """What `empty_warning` says while the first pass scans, and a search once it is done."""
    during: list[str] = []
    done = asyncio.Event()

    def progress(state: PassState) -> None:
        if state.completed:
            done.set()
        elif state.phase == "scanning":
            during.append(indexer.answers.empty_warning())

    indexer = indexer_of_a_picture(tmp_path, progress)
    await indexer.start()
    try:
        await asyncio.wait_for(done.wait(), 120)
        return during, await indexer.answers.search(SearchRequest(query="anything"))
    finally:
        await indexer.stop()


def test_sources_without_a_readable_document_say_so_once_a_pass_is_done(tmp_path):
    during, answer = asyncio.run(searches_around_the_first_pass(tmp_path))
    assert during and set(during) == {"nothing is indexed yet: the index is scanning"}
    assert answer.results == []
    assert answer.warnings == [
        "nothing is indexed: the sources hold no document Metis reads "
        "(Markdown, text, HTML, PDF, DOCX)"
    ]
