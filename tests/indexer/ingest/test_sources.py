"""Walking a source on a real folder tree: kinds, skipped counts, hidden paths, links."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metis_indexer.documents import Kind
from metis_indexer.ingest import sources


def make(root: Path, *paths: str) -> None:
    for path in paths:
        file = root / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(f"content of {path}\n")


@pytest.fixture
def drive(tmp_path: Path) -> Path:
    root = tmp_path / "drive"
    make(
        root,
        "README.md",
        "handbook/leave.MD",
        "handbook/hr/policy.pdf",
        "handbook/hr/form.docx",
        "handbook/site/index.html",
        "notes.txt",
        "data/table.csv",
        "logo.png",
        "pics/a.PNG",
        "Makefile",
        "deck.pptx",
        ".hidden.md",
        ".git/config",
        ".metis/evals.jsonl",
        "handbook/.drafts/draft.md",
        ".DS_Store",
    )
    return root


def test_lists_the_kinds_the_spec_reads_and_counts_the_rest(drive):
    listing = sources.walk(drive)
    assert [(f.path, f.kind) for f in listing.files] == [
        ("README.md", Kind.MD),
        ("data/table.csv", Kind.TXT),
        ("handbook/hr/form.docx", Kind.DOCX),
        ("handbook/hr/policy.pdf", Kind.PDF),
        ("handbook/leave.MD", Kind.MD),
        ("handbook/site/index.html", Kind.HTML),
        ("notes.txt", Kind.TXT),
    ]
    assert listing.skipped == {".png": 2, "": 1, ".pptx": 1}  # hidden files are not counted
    assert (listing.links_skipped, listing.unreadable) == (0, ())


def test_each_file_has_what_a_pass_compares(drive):
    [readme] = [f for f in sources.walk(drive).files if f.path == "README.md"]
    info = (drive / "README.md").stat()
    assert readme.absolute == drive / "README.md"
    assert (readme.size, readme.mtime_ns) == (info.st_size, info.st_mtime_ns)


def test_a_source_path_lists_its_folder_with_paths_in_the_drive(drive):
    listing = sources.walk(drive, "handbook/hr")
    assert [f.path for f in listing.files] == ["handbook/hr/form.docx", "handbook/hr/policy.pdf"]
    assert sources.walk(drive, "handbook/hr/").files == listing.files


def test_a_hidden_source_path_lists_nothing(drive):
    assert sources.walk(drive, "handbook/.drafts").files == ()


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../other", "source path '../other' has a '..' part; name the folder plainly"),
        ("handbook/./hr", "source path 'handbook/./hr' has a '.' part; name the folder plainly"),
        (".", "source path '.' has a '.' part; name the folder plainly"),
        ("/handbook", "source path '/handbook' must be relative to its drive, without a leading /"),
    ],
)
def test_a_path_with_dot_parts_is_refused_naming_the_problem(drive, path, message):
    with pytest.raises(ValueError) as refused:
        sources.walk(drive, path)
    assert str(refused.value) == message


def test_a_missing_folder_is_an_error_not_an_empty_source(drive):
    with pytest.raises(sources.SourceError, match="'handbook/gone' is not a folder of the drive"):
        sources.walk(drive, "handbook/gone")
    with pytest.raises(sources.SourceError, match="is not a folder"):
        sources.walk(drive / "README.md")


def test_links_to_files_inside_the_drive_are_listed_under_their_own_name(drive):
    (drive / "latest.md").symlink_to("handbook/leave.MD")
    listing = sources.walk(drive)
    [link] = [f for f in listing.files if f.path == "latest.md"]
    assert link.kind is Kind.MD
    assert link.size == (drive / "handbook/leave.MD").stat().st_size


def test_links_out_of_the_drive_to_folders_hidden_or_broken_are_skipped(drive, tmp_path):
    outside = tmp_path / "outside"
    make(outside, "secret.md", "folder/x.md")
    before = [f.path for f in sources.walk(drive).files]
    (drive / "escape.md").symlink_to(outside / "secret.md")
    (drive / "escape-relative.md").symlink_to("../outside/secret.md")
    (drive / "outside-folder").symlink_to(outside / "folder")
    (drive / "inside-folder").symlink_to("handbook")  # never descended: no loops, no twins
    (drive / "evals.md").symlink_to(".metis/evals.jsonl")
    (drive / "broken.md").symlink_to("nowhere.md")
    (drive / "loop-a.md").symlink_to("loop-b.md")
    (drive / "loop-b.md").symlink_to("loop-a.md")
    (drive / "handbook/up").symlink_to("..")  # a loop if it were followed
    listing = sources.walk(drive)
    assert [f.path for f in listing.files] == before
    assert listing.links_skipped == 9


def test_a_source_path_that_is_a_link_out_of_the_drive_is_refused(drive, tmp_path):
    make(tmp_path / "elsewhere", "x.md")
    (drive / "handbook/external").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(sources.SourceError, match="leads out of its drive"):
        sources.walk(drive, "handbook/external")


def test_a_drive_mounted_through_a_link_is_walked(drive, tmp_path):
    mount = tmp_path / "mount"
    mount.symlink_to(drive)
    paths = [f.path for f in sources.walk(drive).files]
    assert [f.path for f in sources.walk(mount).files] == paths


@pytest.mark.skipif(os.geteuid() == 0, reason="root lists folders whatever their mode")
def test_a_folder_that_cannot_be_listed_is_reported(drive):
    locked = drive / "handbook/hr"
    locked.chmod(0)
    try:
        listing = sources.walk(drive)
    finally:
        locked.chmod(0o755)
    assert listing.unreadable == ("handbook/hr",)
    assert not [f for f in listing.files if f.path.startswith("handbook/hr/")]
