"""A document's chunks are written from its flat columns: each chunk's stored words are
the blob one chunk alone would give (what `load_chunks` reads back)."""

from __future__ import annotations

import hypothesis
import numpy as np
from hypothesis import strategies as st

from metis_indexer.index.store import _terms_blob, _terms_blobs


@hypothesis.given(st.lists(st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(1, 999)),
                                    max_size=6), max_size=8))
def test_a_documents_blobs_are_each_chunks_own(chunks):
    sizes = np.array([len(c) for c in chunks], dtype=np.int64)
    term_ids = np.array([t for c in chunks for t, _ in c], dtype=np.int32)
    counts = np.array([n for c in chunks for _, n in c], dtype=np.int32)
    assert _terms_blobs(term_ids, counts, sizes) == [
        _terms_blob(np.array([t for t, _ in c], dtype=np.int32),
                    np.array([n for _, n in c], dtype=np.int32))
        for c in chunks
    ]
