"""Chunking (`metis_indexer.ingest.chunking`): the guarantees as properties, the rules against
a naive reference, and a few cuts worked out by hand."""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metis_indexer.documents import Chunk, Kind, ParsedDocument, Section
from metis_indexer.ingest.chunking import chunk_document, chunk_text

PROPERTY = settings(
    # `make mutation` runs these once per mutant and asks for fewer examples.
    max_examples=int(os.environ.get("METIS_PROPERTY_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# --- What the module documents, written out character by character ---------------------

CLOSERS = "\"'”’)]}»」』）"
CJK_LETTERS = ((0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF))
CJK_OTHERS = ((0x3000, 0x303F), (0xFF00, 0xFFEF))


def in_ranges(c: str, ranges: tuple[tuple[int, int], ...]) -> bool:
    return any(lo <= ord(c) <= hi for lo, hi in ranges)


def is_word_start(text: str, i: int) -> bool:
    c = text[i]
    if c.isspace():
        return False
    if i == 0 or in_ranges(c, CJK_LETTERS):
        return True
    before = text[i - 1]
    return before.isspace() or in_ranges(before, CJK_LETTERS + CJK_OTHERS)


def sentence_ends(text: str) -> set[int]:
    ends = set()
    for i, c in enumerate(text):
        for marks, needs_space in ((".!?…", True), ("。！？", False)):
            if c in marks:
                j = i
                while j < len(text) and text[j] in marks:
                    j += 1
                while j < len(text) and text[j] in CLOSERS:
                    j += 1
                if not needs_space or j == len(text) or text[j].isspace():
                    ends.add(j)
    return ends


def paragraph_ends(text: str) -> set[int]:
    """Where the text of each line ends that a blank line (ended by a line break) follows."""
    ends = set()
    lines = text.split("\n")
    offset = 0
    for i, line in enumerate(lines[:-2]):
        if line.strip() and not lines[i + 1].strip():
            ends.add(offset + len(line.rstrip()))
        offset += len(line) + 1
    return ends


def trimmed(text: str, start: int, end: int) -> tuple[int, int] | None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


def sentences(text: str) -> list[tuple[int, int]]:
    bounds = sorted(sentence_ends(text) | paragraph_ends(text) | {0, len(text)})
    spans = (trimmed(text, a, b) for a, b in itertools.pairwise(bounds))
    return [span for span in spans if span]


def sentence_around(spans: list[tuple[int, int]], position: int) -> tuple[int, int] | None:
    """The sentence of `spans` that `position` falls strictly inside, if any."""
    return next(((a, b) for a, b in spans if a < position < b), None)


def reference_spans(text: str, size: int, overlap: int) -> list[tuple[int, int]]:
    """The rules of `metis_indexer.ingest.chunking`, one character at a time."""
    n = len(text.rstrip())
    half = (size + 1) // 2
    paragraphs, ends, said = paragraph_ends(text), sentence_ends(text), sentences(text)
    start = next((i for i in range(n) if not text[i].isspace()), None)
    spans: list[tuple[int, int]] = []
    while start is not None:
        if n - start <= size:
            return [*spans, (start, n)]
        low, high = start + half, start + size
        cut = high
        for candidates in (
            paragraphs,
            ends,
            {i for i in range(low, high + 1) if text[i] == "\n"},
            {i for i in range(low, high + 1) if text[i].isspace()},
        ):
            within = [i for i in candidates if low <= i <= high]
            if within:
                cut = max(within)
                break
        end = start + len(text[start:cut].rstrip())
        spans.append((start, end))
        resume = next(i for i in range(end, n) if not text[i].isspace())
        cut_sentence = sentence_around(said, end)
        if cut_sentence and cut_sentence[0] > start and cut_sentence[1] - cut_sentence[0] <= size:
            start = cut_sentence[0]
            continue
        first = max(end - overlap, start + 1)
        word = next((i for i in range(first, resume + 1) if is_word_start(text, i)), resume)
        start = resume if resume - word >= half else word
    return spans


# --- Texts ------------------------------------------------------------------------------

LETTERS = "abcdefghijklmnopqrstuvwxyzéèàçüößñ"
WORDS = st.text(alphabet=LETTERS, min_size=1, max_size=10)
LONG_WORDS = st.text(alphabet="abcxyz0123456789é-_/.", min_size=60, max_size=400)
CJK_RUNS = st.text(alphabet="中文字测试日本語のテキスト。！？「」、", min_size=1, max_size=60)
SEPARATORS = st.sampled_from(
    [
        " ",
        " ",
        " ",
        "  ",
        "\n",
        "\n\n",
        "\n \n",
        "\n\n\n",
        "\t",
        ", ",
        ". ",
        "! ",
        "? ",
        "… ",
        "。",
        '." ',
        ".) ",
        ".\n",
        "   \n\n",
        "\u3000",
        "\xa0",
        "\u2028",
        " " * 250,
        "\n" * 12,
    ]
)
SOUP = st.lists(
    st.one_of(WORDS, WORDS, SEPARATORS, SEPARATORS, LONG_WORDS, CJK_RUNS), min_size=30, max_size=120
).map("".join)


@st.composite
def prose(draw: st.DrawFn) -> str:
    """Words joined mostly by spaces, with line wraps, and sentence ends at a rate drawn
    per text: from none (sentences are whole paragraphs, often longer than a chunk) to
    many."""
    ends = draw(st.sampled_from([0, 1, 4]))
    gap = st.sampled_from(
        [" "] * 80 + ["\n"] * 8 + ["\n\n", ".\n\n"] + [". ", "? ", '." ', ".\n", "… "] * ends
    )
    words = draw(st.lists(WORDS, min_size=60, max_size=400))
    gaps = draw(st.lists(gap, min_size=len(words), max_size=len(words)))
    return "".join(word + after for word, after in zip(words, gaps, strict=True))


TEXTS = st.one_of(
    prose(),
    SOUP,
    st.text(alphabet=" \n\t.!?。ab中」", min_size=300, max_size=1500),
    st.text(min_size=300, max_size=1500),
)


@st.composite
def sizes(draw: st.DrawFn) -> tuple[int, int]:
    size = draw(st.integers(200, 400))
    return size, draw(st.integers(0, (size - 1) // 2))


# --- The guarantees, as properties --------------------------------------------------------


@PROPERTY
@given(TEXTS, sizes())
def test_chunks_are_trimmed_nonempty_and_at_most_size(text: str, params: tuple[int, int]) -> None:
    size, overlap = params
    for start, end in chunk_text(text, size, overlap):
        piece = text[start:end]
        assert 0 < len(piece) <= size
        assert piece == piece.strip()


@PROPERTY
@given(TEXTS, sizes())
def test_every_non_whitespace_character_is_in_a_chunk(text: str, params: tuple[int, int]) -> None:
    covered = bytearray(len(text))
    for start, end in chunk_text(text, *params):
        covered[start:end] = b"\1" * (end - start)
    assert all(covered[i] or c.isspace() for i, c in enumerate(text))


@PROPERTY
@given(TEXTS, sizes())
def test_each_chunk_moves_forward_and_adds_text(text: str, params: tuple[int, int]) -> None:
    spans = chunk_text(text, *params)
    for (start, end), (next_start, next_end) in itertools.pairwise(spans):
        assert start < next_start
        assert end < next_end


@PROPERTY
@given(TEXTS, sizes())
def test_next_chunk_starts_on_a_word_within_the_overlap(text: str, params: tuple[int, int]) -> None:
    size, overlap = params
    spans = chunk_text(text, size, overlap)
    for (start, end), (next_start, _) in itertools.pairwise(spans):
        # On a word, or right where a long word was cut hard.
        assert is_word_start(text, next_start) or next_start == end
        if next_start == end and not is_word_start(text, next_start):
            first = max(end - overlap, start + 1)
            assert not any(is_word_start(text, i) for i in range(first, end + 1))
        if end - next_start > overlap:
            # More only to hold whole the sentence the previous chunk cut.
            cut = sentence_around(sentences(text), end)
            assert cut is not None
            assert cut[0] == next_start
            assert cut[1] - cut[0] <= size


@PROPERTY
@given(TEXTS, sizes())
def test_a_sentence_that_fits_is_whole_in_some_chunk(text: str, params: tuple[int, int]) -> None:
    size, overlap = params
    spans = chunk_text(text, size, overlap)
    for first, last in sentences(text):
        if last - first <= size:
            assert any(start <= first and last <= end for start, end in spans), (first, last)


@PROPERTY
@given(TEXTS, sizes())
def test_cuts_follow_the_documented_rules(text: str, params: tuple[int, int]) -> None:
    assert chunk_text(text, *params) == reference_spans(text, *params)


SECTIONS = st.lists(
    st.builds(
        Section,
        headings=st.lists(st.sampled_from(["Intro", "Setup", "Ünïcode", "深入"]), max_size=3).map(
            tuple
        ),
        text=TEXTS | st.sampled_from(["", " \n\t "]),
        page=st.none() | st.integers(1, 50),
        line=st.none() | st.integers(1, 10_000),
    ),
    max_size=4,
)


@PROPERTY
@given(SECTIONS, st.none() | st.text(max_size=20), sizes())
def test_chunks_stay_in_their_section_and_keep_its_citation(
    sections: list[Section], title: str | None, params: tuple[int, int]
) -> None:
    doc = ParsedDocument(title=title, kind=Kind.MD, sections=tuple(sections))
    chunks = chunk_document(doc, *params)
    for index, section in enumerate(sections):
        own = [c for c in chunks if c.section == index]
        assert [(c.start, c.start + len(c.text)) for c in own] == chunk_text(section.text, *params)
        for chunk in own:
            assert chunk.text == section.text[chunk.start : chunk.start + len(chunk.text)]
            citation = (chunk.title, chunk.headings, chunk.page)
            assert citation == (title, section.headings, section.page)
    assert [c.section for c in chunks] == sorted(c.section for c in chunks)


@PROPERTY
@given(SECTIONS, sizes())
def test_line_is_the_line_of_the_chunks_first_character(
    sections: list[Section], params: tuple[int, int]
) -> None:
    doc = ParsedDocument(title=None, kind=Kind.TXT, sections=tuple(sections))
    for chunk in chunk_document(doc, *params):
        section = sections[chunk.section]
        if section.line is None:
            assert chunk.line is None
            continue
        lines = section.text.split("\n")
        row = chunk.line - section.line
        column = chunk.start - sum(len(line) + 1 for line in lines[:row])
        assert 0 <= column < len(lines[row])
        assert lines[row][column:].startswith(chunk.text.split("\n")[0])


# --- Cuts worked out by hand -------------------------------------------------------------


def sentence(word: str, count: int) -> str:
    return " ".join([word] * count) + "."


def test_three_paragraphs_cut_at_paragraph_then_sentence_ends() -> None:
    # alpha [0, 110) · blank line · beta [112, 275) · blank line · gamma [277, 350)
    text = "\n\n".join(
        [
            " ".join([sentence("alpha", 6)] * 3),
            " ".join([sentence("beta", 8)] * 4),
            " ".join([sentence("gamma", 6)] * 2),
        ]
    )
    # The first ends at the paragraph end (110 is in [100, 200]); the second, with no
    # paragraph end in [161, 261], at its last sentence end (234). Each next one starts
    # on the first word at or after 50 before the end: 61 and 188.
    assert chunk_text(text, 200, 50) == [(0, 110), (61, 234), (188, 350)]
    doc = ParsedDocument(title=None, kind=Kind.MD, sections=(Section((), text, line=10),))
    assert [(c.start, c.line) for c in chunk_document(doc, 200, 50)] == [
        (0, 10),
        (61, 10),
        (188, 12),
    ]


def test_blank_lines_in_a_row_are_one_paragraph_end() -> None:
    # alpha [0, 90) · 30 line breaks · beta [120, 170) · gamma [171, 411): the paragraph
    # end is at 90, before [100, 200], so the first chunk ends at the sentence end at 170.
    text = (
        ("alpha " * 15).rstrip()
        + "."
        + "\n" * 30
        + sentence("beta", 10)
        + " "
        + sentence("gamma", 40)
    )
    assert chunk_text(text, 200, 50) == [(0, 170), (120, 320), (273, 411)]


def test_line_end_when_no_sentence_ends() -> None:
    # Fifteen 20-character lines and no sentence end: the lines end at 21k + 20, so the
    # last line end in [100, 200] is 188; the first word at or after 138 starts line 7.
    # The list is one sentence, longer than the size: no chunk could hold it whole.
    text = "\n".join(f"- item {i:02d} xxxxxxxxxx" for i in range(15))
    spans = chunk_text(text, 200, 50)
    assert spans == [(0, 188), (147, 314)]
    assert text[147:].startswith("- item 07")


def test_word_boundary_when_no_line_ends() -> None:
    text = "word " * 100
    assert chunk_text(text, 200, 50) == [(0, 199), (150, 349), (300, 499)]


def test_long_word_is_cut_hard_and_continued_without_overlap() -> None:
    text = "a " + "x" * 500
    assert chunk_text(text, 200, 50) == [(0, 200), (200, 400), (400, 502)]


def test_long_blank_run_is_skipped_rather_than_overlapped() -> None:
    # The overlap would start the next chunk at 100, and a chunk from there could end
    # in the blank run, holding nothing new: it starts after the run instead.
    text = ("word " * 30).rstrip() + " " * 300 + "end."
    assert chunk_text(text, 200, 50) == [(0, 149), (449, 453)]


def test_cut_sentence_is_taken_whole_by_the_next_chunk() -> None:
    # A 60-character sentence, then a 150-character one wrapped every six words: no
    # sentence end falls in [100, 200], so the first chunk ends at the line end at 180,
    # inside the second sentence, and the next chunk starts at that sentence (61).
    words = ["beta"] * 30
    wrapped = "".join(w + ("\n" if i % 6 == 5 else " ") for i, w in enumerate(words)).rstrip()
    text = sentence("alpha", 10) + " " + wrapped + "."
    assert chunk_text(text, 200, 50) == [(0, 180), (61, 211)]


def test_cjk_sentences_end_without_a_space_and_every_character_is_a_word() -> None:
    text = "这是一个测试句子。" * 40
    assert chunk_text(text, 200, 50) == [(0, 198), (148, 342), (292, 360)]


def test_leading_whitespace_is_trimmed_and_the_line_follows() -> None:
    doc = ParsedDocument(
        title="T", kind=Kind.TXT, sections=(Section(("H",), "\n\n  Hello world.\n  ", line=5),)
    )
    [chunk] = chunk_document(doc)
    assert chunk == Chunk("T", ("H",), "Hello world.", page=None, line=7, section=0, start=4)


def test_blank_sections_give_no_chunks() -> None:
    doc = ParsedDocument(
        title="T",
        kind=Kind.PDF,
        sections=(
            Section((), "", page=1),
            Section((), " \n\t\u3000 ", page=2),
            Section((), "x", page=3),
        ),
    )
    assert [(c.section, c.page, c.text) for c in chunk_document(doc)] == [(2, 3, "x")]


@pytest.mark.parametrize("shift", range(4))
def test_the_defaults_are_1200_and_200(shift: int) -> None:
    # Words of one to five letters: shifted by 1 to 3, a word starts at exactly `end - 200`
    # of some chunk, where an overlap of 201 would start one word earlier.
    text = ("a bb ccc dddd eeeee " * 400)[shift:]
    assert chunk_text(text) == reference_spans(text, 1200, 200)
    doc = ParsedDocument(title=None, kind=Kind.TXT, sections=(Section((), text),))
    assert [(c.start, c.start + len(c.text)) for c in chunk_document(doc)] == chunk_text(text)


def test_default_size_and_overlap() -> None:
    text = " ".join(sentence("word", 12) for _ in range(100))
    doc = ParsedDocument(title=None, kind=Kind.TXT, sections=(Section((), text),))
    chunks = chunk_document(doc)
    assert all(len(c.text) <= 1200 for c in chunks)
    assert all(len(c.text) >= 600 for c in chunks[:-1])
    for before, after in itertools.pairwise(chunks):
        assert 0 < before.start + len(before.text) - after.start <= 200


@pytest.mark.parametrize(
    ("size", "overlap", "named"),
    [
        (199, 0, "^chunking size"),
        (4001, 200, "^chunking size"),
        (200, 100, "^chunking overlap"),
        (1200, -1, "^chunking overlap"),
    ],
)
def test_arguments_out_of_range_are_refused(size: int, overlap: int, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        chunk_text("text", size, overlap)
    with pytest.raises(ValueError, match=named):
        chunk_document(ParsedDocument(title=None, kind=Kind.TXT, sections=()), size, overlap)


def test_limits_are_accepted() -> None:
    assert chunk_text("a b", 200, 99) == [(0, 3)]
    assert chunk_text("a b", 4000, 1999) == [(0, 3)]


# --- Every kind of end, at every offset around a chunk's edges ----------------------------
# The properties draw texts at random; an off-by-one at exactly `size`, at exactly half of
# it, or at exactly `overlap` needs an end at that very offset, which a random text rarely
# puts there. These texts put one there for each offset in a window around those edges.

MARKERS = {
    "paragraph after trailing blanks": "end  \n\nnext",
    # A sentence end just before a paragraph end whose line ends in blanks: with the blanks
    # counted, the paragraph end would fall out of the window and the cut move back.
    "paragraph after a sentence and a blank": "end. more \n\nnext",
    "paragraph after a sentence and blanks": "end. more  \n \nnext",
    "paragraph on a line of its own": "end. \nmore  \n\nnext",
    "paragraph after a tab": "end\t\n \nnext",
    "paragraph": "end\n\nnext",
    "sentence": "end. Next",
    "sentence with closers": 'end.") Next',
    "cjk sentence": "終わり。次",
    "line": "end\nnext",
    "space": "end next",
    "none": "endnext",
}


def filler(length: int, wordy: bool) -> str:
    """`length` characters with no end of any kind, or words split by single spaces."""
    return ("abcd " * (length // 5 + 1))[:length] if wordy else "x" * length


def edge_texts(size: int) -> list[tuple[str, str]]:
    half = (size + 1) // 2
    cases = []
    for name, marker in MARKERS.items():
        for wordy in (False, True):
            for at in [*range(half - 4, half + 4), *range(size - 6, size + 4)]:
                text = filler(at, wordy) + marker + filler(2 * size, wordy) + ". " + "tail " * 9
                cases.append((f"{name}@{at}{'-words' if wordy else ''}", text))
    return cases


@pytest.mark.parametrize(("size", "overlap"), [(200, 0), (201, 1), (200, 99), (201, 100)])
def test_an_end_at_each_offset_around_the_edges_cuts_as_documented(size: int, overlap: int) -> None:
    for name, text in edge_texts(size):
        assert chunk_text(text, size, overlap) == reference_spans(text, size, overlap), name


def words_sentence(length: int) -> str:
    """A sentence of exactly `length` characters: words, then a full stop."""
    return ("lorem " * length)[: length - 1] + "."


@pytest.mark.parametrize(
    ("length", "second"),
    [
        (199, (62, 261)),  # fits: the next chunk takes it whole, from its first word
        (200, (62, 262)),  # exactly the size still fits
        (201, (152, 263)),  # one more does not: on a word within the overlap instead
    ],
)
def test_a_cut_sentence_of_at_most_size_is_taken_whole(
    length: int, second: tuple[int, int]
) -> None:
    # "aaa…a." ends at 61, before the first chunk's window [100, 200] opens; the sentence
    # after it, from 62, has no end in the window, so the chunk is cut at a space inside it.
    text = "a" * 60 + ". " + words_sentence(length) + " " + "tail words " * 30
    spans = chunk_text(text, 200, 50)
    assert spans[:2] == [(0, 199), second]


@pytest.mark.parametrize(
    ("length", "spans"),
    [(199, [(0, 199)]), (200, [(0, 200)]), (201, [(0, 200), (200, 201)])],
)
def test_a_text_of_exactly_the_size_is_one_chunk(length: int, spans: list[tuple[int, int]]) -> None:
    assert chunk_text("x" * length, 200, 50) == spans


def test_a_cut_sentence_may_end_at_a_paragraph_end() -> None:
    # The sentence from 62 has no full stop: a blank line ends it at 251, 189 characters on,
    # so it fits and the next chunk takes it whole.
    text = "a" * 60 + ". " + ("lorem " * 40)[:189] + "\n\n" + "tail words " * 30
    assert chunk_text(text, 200, 50)[:2] == [(0, 199), (62, 251)]


def test_a_full_stop_that_opens_the_text_ends_a_sentence() -> None:
    # The sentence after ". " starts at 2, after the chunk did at 0, so the next chunk
    # takes it whole: a sentence end at position 1 counts like any other.
    text = ". " + words_sentence(199) + " " + "more words here " * 20
    assert chunk_text(text, 200, 50)[:2] == [(0, 199), (2, 201)]


def test_a_chunk_shorter_than_the_overlap_looks_for_a_word_after_its_first_character() -> None:
    # "中文", blanks, "b", blanks: the first chunk is cut at its last blank (112) and trimmed
    # to 53. The search for a word starts at 0 + 1 = 1, where 文 (a CJK letter) is a word,
    # 112 before the next text at 113: a long blank run, so the next chunk starts at 113,
    # not on "b".
    text = "中文" + " " * 50 + "b" + " " * 60 + "c" * 300
    assert chunk_text(text, 200, 99) == [(0, 53), (113, 313), (313, 413)]
