"""Markdown on real files (perf corpus), each expectation checked by hand against the file."""

from __future__ import annotations

import re

import pytest

from metis_indexer.documents import Kind
from metis_indexer.ingest.readers import encoding, markdown

from .paths import PERF


def read(relative: str):
    return markdown.read((PERF / relative).read_bytes())


def test_title_is_the_first_h1_when_there_is_no_front_matter():
    doc = read("tldr/pages/common/tar.md")
    assert doc.kind is Kind.MD
    assert doc.title == "tar"
    [section] = doc.sections
    assert section.headings == ("tar",)
    assert section.line == 3
    assert section.text.startswith("> Archiving utility.\n")


def test_front_matter_title_and_section_lines():
    doc = read("opentelemetry.io/content/en/blog/2023/new-apac-meetings.md")
    assert doc.title == "New APAC Collector-SIG meetings"
    assert [(s.headings, s.line) for s in doc.sections] == [((), 9), (("Meeting times",), 18)]
    assert doc.sections[0].text.startswith("As the collector community grows worldwide")
    assert doc.sections[1].text.startswith("|         | UTC−08:00 (PST) |")


def test_hashes_inside_code_fences_are_not_headings():
    doc = read("helm-www/docs/chart_best_practices/values.md")
    assert doc.title == "Values"
    assert [(s.headings, s.line) for s in doc.sections] == [
        ((), 7),
        (("Naming Conventions",), 13),
        (("Flat or Nested Values",), 36),
        (("Make Types Clear",), 78),
        (("Consider How Users Will Use Your Values",), 95),
        (("Document values.yaml",), 140),
    ]
    assert "```yaml\n# the host name for the webserver\n" in doc.sections[-1].text


def test_heading_path_is_outermost_first_without_attribute_ids():
    doc = read("rust-rfcs/text/0048-traits.md")
    assert doc.title is None  # no front matter, no level-1 heading
    assert doc.sections[0].line == 1
    assert doc.sections[0].text.startswith("- Start Date: 2014-06-10\n")
    third = doc.sections[3]
    assert third.headings == (
        "Motivation",
        "Use cases",
        "Poor interaction with overloadable deref and index",
    )
    assert third.line == 31
    assert third.text.startswith("*Addressed by:* New method resolution algorithm.")
    assert doc.sections[7].headings == ("Motivation", "Properties")


def test_commented_out_text_is_blank_and_lines_still_count():
    doc = read("rust-rfcs/text/1860-manually-drop.md")
    assert all("No drawbacks known" not in s.text for s in doc.sections)
    assert all("Drawbacks" not in s.headings for s in doc.sections)


@pytest.mark.parametrize(
    "folder", ["rust-rfcs/text", "helm-www/docs", "opentelemetry.io/content/en/docs/concepts"]
)
def test_every_section_line_names_its_source_line(folder):
    """The contract the chunker relies on: text line k is source line `line + k`."""
    files = sorted((PERF / folder).rglob("*.md"))
    assert len(files) > 10
    for path in files:
        source = encoding.decode_text(path.read_bytes()).split("\n")
        for section in markdown.read(path.read_bytes()).sections:
            for k, text_line in enumerate(section.text.split("\n")):
                if text_line:  # comment lines are kept blank; the last one is right-trimmed
                    assert source[section.line - 1 + k].rstrip() == text_line.rstrip(), (
                        path,
                        section.line,
                        k,
                    )


def test_setext_headings_and_their_paragraph():
    doc = markdown.read(
        b"Intro\n\nFirst\npart\n=====\nbody one\n\nSecond\n------\nbody two\n"
        b"- item\n---\nafter a rule\n"
    )
    assert doc.title == "First part"
    assert [(s.headings, s.line, s.text) for s in doc.sections] == [
        ((), 1, "Intro"),
        (("First part",), 6, "body one"),
        (("First part", "Second"), 10, "body two\n- item\n---\nafter a rule"),
    ]


def test_toml_front_matter_and_closing_hashes():
    doc = markdown.read(b'+++\ntitle = "Hugo page"\n+++\n## Setup ##\n\nRun it.\n')
    assert doc.title == "Hugo page"
    assert [(s.headings, s.line, s.text) for s in doc.sections] == [(("Setup",), 6, "Run it.")]


def test_broken_front_matter_is_skipped_without_a_title():
    doc = markdown.read(b"---\ntitle: [unclosed\n---\n# Real\ntext\n")
    assert doc.title == "Real"
    assert doc.sections[0].line == 5


def test_windows_line_endings_keep_lines_exact():
    doc = markdown.read(b"# A\r\n\r\none\r\ntwo\r\n## B\r\nthree\r\n")
    assert [(s.headings, s.line, s.text) for s in doc.sections] == [
        (("A",), 3, "one\ntwo"),
        (("A", "B"), 6, "three"),
    ]
    assert not any(re.search(r"\r", s.text) for s in doc.sections)
