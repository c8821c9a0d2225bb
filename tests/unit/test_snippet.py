from metis_indexer.snippet import LIMIT, sentences, snippet
from metis_indexer.tokens import words

TEXT = (
    "The office opens at nine. Everyone gets 25 days of paid vacation each year, "
    "taken in agreement with the team. Sick leave is separate. "
) * 4


def test_the_sentence_with_most_question_words_is_in_the_snippet():
    s = snippet(TEXT, words("how many vacation days per year"))
    assert "25 days of paid vacation each year" in s
    assert len(s) <= LIMIT


def test_short_text_is_whole_and_unmarked():
    assert snippet("Sick leave is separate.", ["leave"]) == "Sick leave is separate."


def test_a_long_sentence_is_cut_around_the_first_hit():
    text = "word " * 200 + "kubernetes operator " + "tail " * 200
    s = snippet(text, ["kubernetes"])
    assert "kubernetes" in s and len(s) <= LIMIT
    assert s.startswith("…") and s.endswith("…")


def test_sentences_split_after_end_punctuation_and_blank_lines():
    text = "One. Two!\n\nThree"
    assert [text[a:b] for a, b in sentences(text)] == ["One.", "Two!", "Three"]
