import pytest
from pydantic import ValidationError

from metis_indexer.config import IndexerConfig, explain


def config(**over):
    base = {"sources": [{"drive": "docs", "root": "/drives/docs"}], "index_dir": "/index"}
    return IndexerConfig.model_validate(base | over)


def error(**over) -> str:
    with pytest.raises(ValidationError) as e:
        config(**over)
    return explain(e.value)


def test_defaults_follow_the_spec():
    c = config()
    assert (c.chunking.size, c.chunking.overlap, c.rescan_seconds, c.port) == (1200, 200, 60, 7700)


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"sources": []}, "sources: List should have at least 1 item"),
        ({"sources": [{"drive": "d", "root": "/d"}] * 17}, "at most 16 items"),
        ({"sources": [{"drive": "d", "root": "/d", "path": "a/../b"}]}, "has a '..' part"),
        ({"chunking": {"size": 100}}, "chunking.size"),
        ({"chunking": {"size": 400, "overlap": 200}}, "less than half of chunking.size"),
        ({"rescan_seconds": 5}, "rescan_seconds is 5; it must be 0 or 10 to 86400"),
        (
            {
                "sources": [
                    {"drive": "d", "root": "/d", "path": "handbook"},
                    {"drive": "d", "root": "/d", "path": "handbook/hr"},
                ]
            },
            "sources d:handbook and d:handbook/hr overlap",
        ),
        (
            {"name": "team", "sources": [{"drive": "metis-team", "root": "/d"}]},
            "source drive metis-team is the base's own notes",
        ),
    ],
)
def test_each_limit_is_refused_naming_the_field(over, words):
    assert words in error(**over)


def test_two_folders_of_one_drive_that_do_not_overlap_are_fine():
    c = config(
        sources=[
            {"drive": "d", "root": "/d", "path": "a"},
            {"drive": "d", "root": "/d", "path": "ab/"},
        ]
    )
    assert [s.path for s in c.sources] == ["a", "ab"]
    assert config(rescan_seconds=0).rescan_seconds == 0
