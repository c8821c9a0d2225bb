"""The texts a chunk is embedded, searched and reranked as."""

from metis_indexer.documents import Chunk
from metis_indexer.index import texts


def test_a_first_heading_that_repeats_the_title_is_said_once() -> None:
    chunk = Chunk("Leave policy", ("Leave policy", "Vacation"), "25 days.", None, 12, 0, 0)
    assert texts.embedded(chunk) == "Leave policy > Vacation\n\n25 days."
    other = Chunk("Handbook", ("Leave policy",), "25 days.", None, 12, 0, 0)
    assert texts.embedded(other) == "Handbook > Leave policy\n\n25 days."


def test_embedding_text_puts_title_and_headings_in_front() -> None:
    chunk = Chunk(
        title="Handbook",
        headings=("Leave policy", "Vacation"),
        text="25 days a year.",
        page=None,
        line=3,
        section=0,
        start=0,
    )
    assert texts.embedded(chunk) == "Handbook > Leave policy > Vacation\n\n25 days a year."
    untitled = Chunk(None, ("Vacation",), "25 days.", None, None, 0, 0)
    assert texts.embedded(untitled) == "Vacation\n\n25 days."
    assert texts.embedded(Chunk(None, (), "25 days.", None, None, 0, 0)) == "25 days."


def test_words_weigh_the_title_twice_and_the_reranker_reads_it_once() -> None:
    assert texts.searched("Handbook", ("Leave", "Vacation"), "25 days.") == (
        "Handbook\nHandbook\nLeave\nVacation\n25 days."
    )
    assert texts.searched(None, (), "25 days.") == "25 days."
    assert texts.reranked("Handbook", ("Leave", "Vacation"), "25 days.") == (
        "Handbook\nLeave\nVacation\n25 days."
    )
    assert texts.reranked(None, (), "25 days.") == "25 days."


def test_a_new_way_of_counting_words_comes_with_a_new_words_version() -> None:
    """Indexes count their words again only when `WORDS_VERSION` moves: counting them another
    way (what `searched` holds, what `tokens.words` cuts) fails here until both move."""
    counted = texts.counted("Handbook", ("Leave policy",), "Configuração: IL-6 and NF-κB, step 2.")
    assert (texts.WORDS_VERSION, dict(counted)) == (
        "2",
        {
            "handbook": 2,
            "leave": 1,
            "policy": 1,
            "configuracao": 1,
            "il": 1,
            "6": 1,
            "and": 1,
            "nf": 1,
            "κb": 1,
            "step": 1,
            "2": 1,
        },
    )
