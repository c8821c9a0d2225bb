"""HTML on real pages: titles, headings, dropped chrome, declared and undeclared charsets."""

from __future__ import annotations

from metis_indexer.documents import Kind
from metis_indexer.ingest.readers import html

from .paths import CHARDET, PERF, READABILITY, TIKA_DOCS, TIKA_HTML


def text_of(doc) -> str:
    return "\n".join(s.text for s in doc.sections)


def test_title_and_heading_paths_of_a_wikipedia_page():
    doc = html.read((READABILITY / "wikipedia-2/source.html").read_bytes())
    assert doc.kind is Kind.HTML
    assert doc.title == "New Zealand - Wikipedia"
    paths = [s.headings for s in doc.sections]
    assert paths[0] == ("New Zealand",)
    assert ("New Zealand", "Government and politics", "Foreign relations and military") in paths
    assert ("New Zealand", "Environment", "Climate") in paths
    history = paths.index(("New Zealand", "History"))
    assert doc.sections[history].text.startswith("Main article: History of New Zealand\n\n")
    assert all(s.page is None and s.line is None for s in doc.sections)


def test_navigation_is_dropped():
    text = text_of(html.read((READABILITY / "wikipedia-2/source.html").read_bytes()))
    assert "Random article" not in text  # the sidebar, role="navigation"
    assert "Privacy policy" not in text  # the page footer
    assert "Aotearoa" in text


def test_page_chrome_outside_the_article_is_dropped_its_own_header_and_footer_kept():
    doc = html.read((READABILITY / "breitbart/source.html").read_bytes())
    text = text_of(doc)
    assert "Copyright © 2017 Breitbart" not in text  # <footer id="footerFootW">
    assert "BREITBART CONNECT" not in text  # <aside id="asideSideW">
    assert "EDIT PROFILE" not in text  # <header id="headerHeadW">
    [tags] = [s for s in doc.sections if s.headings[-1:] == ("Read More Stories About:",)]
    assert tags.text.startswith("Tech, Donald Trump, facebook")  # <article><footer><aside>
    title = "'Neutral' Snopes Fact-Checker David Emery: 'Are There Any Un-Angry Trump Supporters?'"
    assert doc.title == title
    assert doc.sections[1].headings == (title,)  # the <h1> in <article><header>


def test_scripts_are_dropped():
    doc = html.read((TIKA_HTML / "testHTML_script_in_body.html").read_bytes())
    assert text_of(doc) == "This is a test."


def test_paragraph_source_line_breaks_are_spaces_and_blocks_are_paragraphs():
    doc = html.read(
        (PERF / "trafilatura-test-html/tests/cache/gregoryszorc.com.python3.html").read_bytes()
    )
    assert doc.title == (
        "Gregory Szorc's Digital Home | Mercurial's Journey to and Reflections on Python 3"
    )
    assert [s.headings for s in doc.sections[1:5]] == [
        ("Mercurial's Journey to and Reflections on Python 3",),
        ("Porting Mercurial to Python 3",),
        ("The Future of Python 3 and Mercurial",),
        ("Commentary on Python 3",),
    ]
    assert (
        "\n\nMercurial 5.2 was released on November 5, 2019. It is the first version of "
        "Mercurial that supports Python 3. This milestone"
    ) in doc.sections[1].text


def test_declared_legacy_charset_is_honoured():
    doc = html.read((TIKA_DOCS / "testHTMLNoisyMetaEncoding_1.html").read_bytes())  # iso-8859-6
    assert text_of(doc).startswith("وأعرب الاتحاد الجزائري وقتها")


def test_bytes_that_are_utf8_win_over_a_wrong_declaration():
    doc = html.read((READABILITY / "qq/source.html").read_bytes())  # declares gb2312
    assert doc.title == "DeepMind新电脑已可利用记忆自学 人工智能迈上新台阶_科技_腾讯网"


def test_a_declared_utf8_that_is_not_falls_back_to_latin1():
    # Really windows-1256 Arabic; the spec's rule for text that is not UTF-8 is Latin-1.
    doc = html.read((TIKA_DOCS / "testArabicMisleadingCharset.html").read_bytes())
    assert doc.title == "Test Arabic"
    assert text_of(doc).startswith("Ýí ÞÑíÉ ãä ÇáÞÑì")


def test_a_bogus_declared_charset_is_ignored():
    doc = html.read((TIKA_HTML / "testHTML_charset_utf16le.html").read_bytes())  # "unicode"
    assert (doc.title, text_of(doc)) == ("Title", "This is a sample text")


def test_utf16_without_a_mark():
    doc = html.read((CHARDET / "UTF-16BE/plane1-utf-16be.html").read_bytes())
    assert doc.title == "Unicode Plane 1 Example Using UTF-16"
    assert doc.sections[0].headings == (
        "Unicode Plane 1 Example Usage For Business Applications",
        "Using UTF-16 Little-Endian Plane 1 Supplementary Characters",
    )


def test_preformatted_text_keeps_its_lines_and_lists_and_cells_their_shape():
    doc = html.read(
        b"<html><body><h1>T</h1><p>a\n  b</p><pre>x  = 1\n  y</pre>"
        b"<ul><li>one</li><li>two<br>three</li></ul><table><tr><td>c1</td><td>c2</td></tr>"
        b"</table><div hidden>no</div><p aria-hidden=true>no</p></body></html>"
    )
    assert doc.title == "T"  # no <title>: the first <h1>
    [section] = doc.sections
    assert section.text == "a b\n\nx  = 1\n  y\n\none\ntwo\nthree\n\nc1 c2"


def test_iso_2022_declared_on_ascii_bytes_is_decoded_as_declared():
    page = '<meta charset="iso-2022-jp"><title>日本語</title>'.encode("iso-2022-jp")
    assert page.isascii()
    assert html.read(page).title == "日本語"


def test_a_declared_latin1_reads_windows_quotes_as_browsers_do():
    page = '<meta charset="iso-8859-1"><p>\x93quoted\x94 café'.encode("latin-1")
    assert html.read(page).sections[0].text == "“quoted” café"
