from metis_indexer.tokens import fold, words


def test_accents_fold_and_case():
    assert words("Configuração") == words("configuracao") == ["configuracao"]
    assert fold("ÅNGSTRÖM Café") == "angstrom cafe"


def test_single_letters_dropped_single_digits_kept():
    assert words("step 2 of a plan, x marks") == ["step", "2", "of", "plan", "marks"]


def test_words_are_runs_of_letters_and_digits():
    assert words("Xid 79: nvidia-smi PO-2231 snake_case") == [
        "xid", "79", "nvidia", "smi", "po", "2231", "snake", "case",
    ]


def test_no_stemming_and_scripts_without_spaces_stay_whole():
    assert words("travel travelling") == ["travel", "travelling"]
    assert words("東京タワーへ行く") == ["東京タワーへ行く"]
