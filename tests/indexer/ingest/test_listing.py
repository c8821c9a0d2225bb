"""The listing of the sources as a pass decides it, over plain data: a source whose earlier
listing has not returned is not listed again, the sources' listings put together, and
what a pass says of a listing that did not finish."""

from __future__ import annotations

from pathlib import Path

from metis_indexer.config import SourceConfig
from metis_indexer.documents import Kind
from metis_indexer.ingest.plan import ListingHung, Scan, merged, source_key, still_listing
from metis_indexer.ingest.sources import Found

DOCS = SourceConfig(drive="docs", root=Path("/drives/docs"))
TEAM = SourceConfig(drive="wiki", root=Path("/drives/wiki"), path="team")
REST = SourceConfig(drive="wiki", root=Path("/drives/wiki"), path="rest")


def found(path: str) -> Found:
    return Found(path, Path("/drives") / path, Path("/drives"), Kind.MD, 10, 1)


def test_a_source_still_listing_is_not_listed_again():
    assert still_listing([DOCS, TEAM, REST], {source_key(TEAM)}) == [TEAM]


def test_every_source_is_listed_once_the_earlier_listings_returned():
    assert still_listing([DOCS, TEAM, REST], set()) == []


def test_another_folder_of_the_same_drive_is_not_held_back():
    assert still_listing([REST], {source_key(TEAM)}) == []


def test_a_source_is_known_by_its_drive_and_folder():
    assert (source_key(DOCS), source_key(TEAM)) == (("docs", ""), ("wiki", "team"))


def test_the_listings_of_the_sources_are_put_together():
    docs = Scan({("docs", "a.md"): found("a.md")}, skipped={".png": 2})
    wiki = Scan(
        {("wiki", "team/b.md"): found("team/b.md")},
        unseen=[("wiki", "team/secret")],
        skipped={".png": 1, ".zip": 1},
        problems=["source wiki: cannot list team/secret"],
    )
    listing = merged([docs, wiki])
    assert sorted(listing.files) == [("docs", "a.md"), ("wiki", "team/b.md")]
    assert list(listing.unseen) == [("wiki", "team/secret")]
    assert listing.skipped == {".png": 3, ".zip": 1}
    assert list(listing.problems) == ["source wiki: cannot list team/secret"]


def test_a_listing_that_did_not_finish_names_its_source_and_the_deadline():
    e = ListingHung([TEAM], 900)
    assert str(e) == (
        "the listing of source wiki/team did not finish in 900 s (is the drive hung?); "
        "the pass is tried again once it has, and what was indexed from it is kept"
    )
    assert e.hung == [("wiki", "team")]
    assert str(ListingHung([DOCS, TEAM], 2.5)).startswith(
        "the listing of sources docs, wiki/team did not finish in 2.5 s"
    )
