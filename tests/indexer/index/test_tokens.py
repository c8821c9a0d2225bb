import re
import unicodedata
from collections import Counter

import hypothesis
from hypothesis import strategies as st

from metis_indexer.index.tokens import counts, fold, words


def test_accents_fold_and_case():
    assert words("Configuração") == words("configuracao") == ["configuracao"]
    assert fold("ÅNGSTRÖM Café") == "angstrom cafe"


def test_single_letters_dropped_single_digits_kept():
    assert words("step 2 of a plan, x marks") == ["step", "2", "of", "plan", "marks"]


def test_words_are_runs_of_letters_and_digits():
    assert words("Xid 79: nvidia-smi PO-2231 snake_case") == [
        "xid",
        "79",
        "nvidia",
        "smi",
        "po",
        "2231",
        "snake",
        "case",
    ]


def test_no_stemming_and_scripts_without_spaces_stay_whole():
    assert words("travel travelling") == ["travel", "travelling"]
    assert words("東京タワーへ行く") == ["東京タワーへ行く"]


def reference_fold(text):
    """Folding written out character by character: the slow, obvious version."""
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


@hypothesis.settings(max_examples=300)
@hypothesis.given(st.text(alphabet=st.characters(codec=None, exclude_categories=())))
def test_folding_matches_the_reference_on_any_text(text):
    assert fold(text) == reference_fold(text)


def test_folding_keeps_lone_surrogates_and_drops_every_mark():
    assert fold("A\ud800É\u0301") == "a\ud800e"


@hypothesis.settings(max_examples=300)
@hypothesis.given(st.text(alphabet=st.characters(codec=None, exclude_categories=())))
def test_counts_are_the_words_counted_in_their_order(text):
    counted = counts(text)
    assert counted == Counter(words(text))
    assert list(counted) == list(dict.fromkeys(words(text)))


def test_counts_drop_single_letters_but_not_single_digits():
    assert counts("a 2 b 2 ab ab ²") == Counter({"2": 3, "ab": 2})


def regex_words(text):
    """The rule as a regular expression over the folded text (what counting did before
    ASCII text was split on its translated spaces)."""
    return [w for w in re.findall(r"[^\W_]+", fold(text)) if len(w) > 1 or w.isdigit()]


@hypothesis.settings(max_examples=500)
@hypothesis.given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_ascii_text_has_the_words_the_regular_expression_finds(text):
    assert words(text) == regex_words(text)
    assert list(counts(text).items()) == list(Counter(regex_words(text)).items())


def test_every_ascii_character_splits_or_joins_words_as_the_regular_expression_says():
    every = "".join(f"ab{chr(c)}cd{chr(c)}1{chr(c)}" for c in range(128))
    assert words(every) == regex_words(every)
    assert words("snake_case CamelCase x\x1fy\x00z2 9") == ["snake", "case", "camelcase", "z2", "9"]
