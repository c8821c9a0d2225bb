"""The whole torture set (../shared/data/torture, 716 hard real files) through the reader pool.

Every file must come back as a document with sections, or as a failure whose reason
is from the fixed vocabulary, within its time limit; what MANIFEST.tsv says is hard
about a file decides what it must come back as. About 70 s on 2 shared cores.
"""

from __future__ import annotations

import csv
import re

import pytest

from metis_indexer.documents import FailReason, Kind, ParsedDocument, ReadFailed
from metis_indexer.ingest import sources
from metis_indexer.ingest.readers.pool import Done, Limits, ReaderPool

from .paths import TORTURE

pytestmark = pytest.mark.slow

GRACE_SECONDS = 5.0
"""Past a limit, the time the pool may take to notice and kill."""

# Files with no text outside their headings, each checked by hand: a document read, with
# nothing to cite. The manifest's text_chars=0 files are the others.
NO_BODY_TEXT = {
    "bat-test-examples/tests/examples/control_characters.txt",  # only C0 control characters
    "chardet-test-files/tests/ascii/_chromium_iso-8859-1_with_no_encoding_specified.html",
    "apache-tika-test-documents/tika-parsers/tika-parsers-standard/"
    "tika-parsers-standard-integration-tests/src/test/resources/test-documents/testHTML_head.html",
    "pandoc-test-docx/test/docx/diagram.docx",  # one heading, "Diagram after:"
    "pandoc-test-docx/test/docx/german-reference.docx",  # one heading, "Test"
}

# What a manifest label means for the outcome: a failure reason, or "read" (sections).
EXPECTED = {
    "pdf:encrypted-password-required": FailReason.PASSWORD,
    "pdf:no-text-layer": FailReason.SCANNED_PDF,
    "pdf:unopenable": FailReason.MALFORMED,
    "docx:encrypted-ooxml": FailReason.PASSWORD,
    "docx:corrupt-zip": FailReason.MALFORMED,
    "pdf:baseline": "read",
    "pdf:non-latin-script-text": "read",
    "pdf:slow-parse": "read",
    "pdf:slow-text-extraction": "read",
    "docx:tracked-changes": "read",
    "docx:text-in-textboxes": "read",
    "docx:non-builtin-heading-name-with-outlineLvl": "read",
    "enc:legacy-8bit/multibyte": "read",
    "enc:utf-16/32-without-BOM": "read",
    "enc:UTF-16LE-BOM": "read",
    "enc:UTF-16BE-BOM": "read",
    "enc:UTF-8-BOM": "read",
    "html:nav/header/footer/aside-boilerplate": "read",
    "html:script/style-heavy": "read",
    "html:declared-charset-mismatch": "read",
    "html:bogus-meta-charset": "read",
    "text:CR-only-line-endings": "read",
    "text:very-long-line": "read",
}


@pytest.fixture(scope="module")
def manifest() -> dict[str, dict[str, str]]:
    with (TORTURE / "MANIFEST.tsv").open(newline="") as f:
        return {row["file"]: row for row in csv.DictReader(f, delimiter="\t")}


@pytest.fixture(scope="module")
def outcomes() -> dict[str, tuple[Kind, Done[ParsedDocument]]]:
    listing = sources.walk(TORTURE)
    with ReaderPool(workers=2) as pool:
        futures = {f.path: (f.kind, pool.submit_read(f.absolute, f.kind)) for f in listing.files}
        return {path: (kind, future.result()) for path, (kind, future) in futures.items()}


def labels(row: dict[str, str]) -> set[str]:
    return {re.sub(r"\(.*", "", label) for label in row["kinds"].split(";")}


def test_every_file_is_listed_or_counted(outcomes, manifest):
    listing = sources.walk(TORTURE)
    assert listing.skipped == {".srt": 7, ".docm": 5, ".dotx": 3}
    read_here = {path for path in manifest if not path.endswith((".srt", ".docm", ".dotx"))}
    assert read_here <= set(outcomes)


def test_every_file_yields_sections_or_a_reason_within_its_limit(outcomes, manifest):
    limits = Limits()
    for path, (kind, done) in outcomes.items():
        result = done.result
        assert done.seconds <= limits.seconds(kind) + GRACE_SECONDS, path
        if isinstance(result, ReadFailed):
            assert result.reason in FailReason, path
            assert result.reason not in (FailReason.TIMEOUT, FailReason.EMBEDDING_REFUSED), path
            continue
        assert isinstance(result, ParsedDocument), path
        assert result.kind is kind, path
        if not result.sections:
            row = manifest[path]
            empty = "text_chars=0" in row["details"] or "text:empty-file" in labels(row)
            assert empty or path in NO_BODY_TEXT, path
        assert all(s.text.strip() for s in result.sections), path


@pytest.mark.parametrize("label", sorted(EXPECTED))
def test_what_is_hard_about_a_file_decides_its_outcome(outcomes, manifest, label):
    expected = EXPECTED[label]
    files = [path for path, row in manifest.items() if label in labels(row) and path in outcomes]
    assert files, label
    for path in files:
        result = outcomes[path][1].result
        if expected == "read":
            assert isinstance(result, ParsedDocument) and result.sections, (path, result)
        else:
            assert isinstance(result, ReadFailed) and result.reason is expected, (path, result)


def test_headings_are_found_whatever_the_language(outcomes, manifest):
    for label in (
        "docx:localized-heading-styleId",
        "docx:non-builtin-heading-name-with-outlineLvl",
    ):
        files = [p for p, row in manifest.items() if label in labels(row) and p.endswith(".docx")]
        found = [p for p in files if _has_headings(outcomes[p][1].result)]
        # diagram.docx has its one heading and nothing under it; pageref.docx only
        # headings after its table of contents, again with nothing under them.
        missing = set(files) - set(found)
        assert {p.rsplit("/", 1)[-1] for p in missing} <= {"diagram.docx", "pageref.docx"}, label


def _has_headings(result: ParsedDocument | ReadFailed) -> bool:
    return isinstance(result, ParsedDocument) and any(s.headings for s in result.sections)
