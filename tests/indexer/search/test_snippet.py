from metis_indexer.index.tokens import words
from metis_indexer.search.snippet import LIMIT, sentences, snippet

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
    the snippet, though the first also matches: the snippet is the sentence with most of the
    question's words."""
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


BEFORE = " ".join(f"a{i:02d}" for i in range(80)) + "."
AFTER = " ".join(f"b{i:02d}" for i in range(40)) + "."


def test_a_short_sentence_is_widened_evenly_and_its_ends_put_on_words():
    """An 18-character sentence leaves 222 of 240: 111 before it and 111 after, each cut end
    moved off the middle of a word, both marked."""
    s = snippet(BEFORE + " The vacation rule. " + AFTER, words("vacation"))
    assert s == (
        "…"
        + " ".join(f"a{i:02d}" for i in range(53, 80))
        + ". The vacation rule. "
        + " ".join(f"b{i:02d}" for i in range(27))
        + "…"
    )


def test_a_sentence_at_the_end_takes_all_its_room_before_it():
    s = snippet(BEFORE + " The vacation rule.", words("vacation"))
    assert s == "…" + " ".join(f"a{i:02d}" for i in range(25, 80)) + ". The vacation rule."
    assert len(s) == LIMIT


def test_a_cut_word_longer_than_the_slack_stays_cut():
    """Moving a cut end onto a word looks 24 characters at most: past that (a long URL), the
    window keeps its place rather than lose the sentence or jump to the passage's start."""
    before = "https://example.org/" + "x" * 130
    after = "https://example.org/" + "y" * 180
    s = snippet(before + ". The vacation rule. " + after + " tail.", words("vacation"))
    assert s.startswith("…" + "x" * 100) and s.endswith("yyy…") and len(s) == LIMIT
    assert "x. The vacation rule. https://example.org/yyy" in s


def test_a_passage_of_exactly_the_limit_is_whole():
    text = ("word " * 48).strip() + "."
    assert len(text) == LIMIT and snippet(text, ["word"]) == text


def test_a_long_sentence_starts_a_third_of_the_limit_before_its_first_hit():
    long = " ".join(f"w{i:03d}" for i in range(100)) + " kubernetes "
    long += " ".join(f"t{i:03d}" for i in range(100))
    s = snippet(long, ["kubernetes"])
    assert s.startswith("…w084 w085 ") and s.index("kubernetes") == 1 + 80
    assert len(s) == LIMIT and s.endswith("…")


def test_a_hit_near_the_end_of_a_long_sentence_keeps_a_full_window():
    long = " ".join(f"w{i:03d}" for i in range(100)) + " kubernetes."
    s = snippet(long, ["kubernetes"])
    assert s.endswith("w099 kubernetes.") and s.startswith("…") and len(s) <= LIMIT
    assert len(s) > LIMIT - 8


def test_blanks_inside_the_snippet_become_one_space():
    assert snippet("Sick   leave\nis  separate.", ["leave"]) == "Sick leave is separate."


def test_an_empty_passage_has_an_empty_snippet():
    assert snippet("", ["leave"]) == "" and sentences("") == []


def test_separators_at_either_end_make_no_empty_sentence():
    text = "\n\nOne. Two. "
    assert sentences(text) == [(2, 6), (7, 11)]


def passage_whose_window_starts_at_1(first_word: str) -> str:
    """The 18-character sentence at 112 leaves 111 characters before it: the window starts at
    the passage's second character, inside its first word."""
    head = (first_word + " " + " ".join(["ab"] * 60))[:109] + "b. "
    return head + "The vacation rule. " + " ".join(["cd"] * 80) + "."


def test_a_window_starting_inside_the_first_word_moves_to_the_next():
    s = snippet(passage_whose_window_starts_at_1("Xy"), words("vacation"))
    assert s.startswith("…ab ab ")


def test_one_character_cut_off_the_front_is_marked_too():
    s = snippet(passage_whose_window_starts_at_1("x" * 30), words("vacation"))
    assert s.startswith("…" + "x" * 29 + " ab")
