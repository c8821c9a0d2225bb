from metis_indexer.documents import Chunk


def test_a_first_heading_that_repeats_the_title_is_said_once():
    chunk = Chunk("Leave policy", ("Leave policy", "Vacation"), "25 days.", None, 12, 0, 0)
    assert chunk.embedding_text == "Leave policy > Vacation\n\n25 days."
    other = Chunk("Handbook", ("Leave policy",), "25 days.", None, 12, 0, 0)
    assert other.embedding_text == "Handbook > Leave policy\n\n25 days."
