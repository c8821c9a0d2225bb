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


FILLER = "Nothing here is about the question at all. " * 5


def test_of_two_matching_sentences_the_one_with_more_question_words_wins():
    """The first sentence names one word of the question, a later one three: the later one is
    the snippet, though the first also matches (spec 002: "most of the question's words")."""
    first = "Vacation requests go to the team lead by mail."
    best = "Everyone gets 25 vacation days every year."
    text = first + " " + FILLER + best + " " + FILLER
    s = snippet(text, words("how many vacation days per year"))
    assert best in s and "team lead" not in s
    assert s.startswith("…") and s.endswith("…") and len(s) <= LIMIT


def test_a_word_said_three_times_counts_once():
    repeated = "Vacation, vacation and more vacation."
    best = "Vacation days are counted per year."
    text = repeated + " " + FILLER + best + " " + FILLER
    s = snippet(text, words("vacation days year"))
    assert best in s and "more vacation" not in s


def test_of_equal_sentences_the_earlier_wins():
    text = "Vacation is paid. " + FILLER + "Vacation is planned. " + FILLER
    s = snippet(text, words("vacation"))
    assert s.startswith("Vacation is paid.") and "planned" not in s
