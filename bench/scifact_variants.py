"""Keyword and fusion variants on SciFact, scored outside the indexer.

Reads the chunks and vectors of a work folder `bench/scifact.py --workdir DIR` indexed, and
re-implements the keyword leg with numpy and scipy over the very same chunks (their words by
`tokens.words`), so a variant costs seconds, not a pass: on the product's formula it gives
what `bench/scifact.py` gives (keyword 0.658 on train), and fusion breaks ties as
`hybrid.py` does (hybrid 0.700 on train, as the product). Documents count by their best
chunk in the top 10, as the benchmark counts them. Tune on `--split train`; the test split is for
reporting a change kept.

    .venv/bin/python bench/scifact_variants.py --workdir DIR [--split train]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import re
import sqlite3
import unicodedata
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from scifact import load_split, model_server, mrr_at, ndcg_at

from metis_indexer.index import tokens
from metis_indexer.search import fusion


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    title_weight: float = 1.0
    """Times the title counts (one field), or its weight in BM25F."""
    bm25f: bool = False
    """The title with its own length normalisation (`title_b`)."""
    title_b: float = 0.75
    k1: float = 1.2
    b: float = 0.75
    document_idf: bool = False
    """idf counted in documents rather than chunks."""
    context: float = 0.0
    """Each chunk also holds its document's other chunks' words, at this weight."""
    query_tf: bool = False
    legs: int = 50
    words: str = "spec"
    """How text becomes words: a name of `ANALYZERS`."""
    bigrams: float = 0.0
    """The weight of adjacent word pairs of the question found adjacent in a chunk, scored
    by BM25 as words are (sequential dependence, as Indri and Anserini weigh it)."""
    per_document: bool = False
    """Each leg's candidates its best chunk per document."""
    ties: str = "keyword first met"
    """Equal fused scores: in the order met with the keyword leg's first (as `hybrid.py`
    now), the dense leg's first (before), by row, or by the better of the two ranks."""
    delta: float = 0.0
    """BM25+'s lower bound of a word's term score, in units of its idf (Lv and Zhai 2011)."""


_GREEK = {
    chr(cp): unicodedata.name(chr(cp)).split()[-1].lower()
    for cp in range(0x3B1, 0x3CA)
    if cp != 0x3C2
}
_COMPOUND = re.compile(r"[^\W_]+(?:[-\u2010\u2011]+[^\W_]+)+")


def _greek(word: str) -> str:
    """Greek letters by name, in place: `nf-κb` as `nf-kappab`, as authors also write it."""
    return "".join(_GREEK.get(c, c) for c in word)


def _kept(word: str) -> bool:
    return len(word) > 1 or word.isdigit()


def spec_words(text: str) -> list[str]:
    return tokens.words(text)


def greek_words(text: str) -> list[str]:
    return [_greek(w) for w in tokens.words(text)]


def _compound_words(text: str, name: Callable[[str], str], names_only: bool = False) -> list[str]:
    """Words as `tokens.words` cuts them, and each hyphenated compound also whole, its parts
    joined (`il-6` as il, 6 and il6; `t-cell` as cell and tcell); `names_only`: only
    compounds with a part of digits or of one or two letters (il-6, t-cell, nf-κb, not
    long-term)."""
    folded = tokens.fold(text)
    out = [name(w) for w in tokens._WORD.findall(folded) if _kept(w)]
    for m in _COMPOUND.finditer(folded):
        parts = tokens._WORD.findall(m.group())
        if names_only and not any(len(p) <= 2 or p.isdigit() for p in parts):
            continue
        out.append(name("".join(parts)))
    return out


ANALYZERS: dict[str, Callable[[str], list[str]]] = {
    "spec": spec_words,
    "greek": greek_words,
    "compounds": lambda t: _compound_words(t, lambda w: w),
    "compounds+greek": lambda t: _compound_words(t, _greek),
    "names": lambda t: _compound_words(t, lambda w: w, names_only=True),
    "names+greek": lambda t: _compound_words(t, _greek, names_only=True),
}


ROUND_1 = (
    Variant("before: one field, idf over chunks"),
    Variant("title twice", title_weight=2),
    Variant("title 3 times", title_weight=3),
    *(
        Variant(f"BM25F title {w}, title b {tb}", title_weight=w, bm25f=True, title_b=tb)
        for w in (1, 1.5, 2, 3)
        for tb in (0.3, 0.75)
    ),
    Variant("idf over documents", document_idf=True),
    Variant("title twice + idf over documents", title_weight=2, document_idf=True),
    *(
        Variant(f"title twice, k1 {k1}, b {b}", title_weight=2, k1=k1, b=b)
        for k1 in (0.9, 1.5)
        for b in (0.6, 0.9)
    ),
    Variant("query tf", query_tf=True),
    *(Variant(f"document context {c}", context=c) for c in (0.2, 0.5, 1.0)),
    *(
        Variant(
            f"title twice + idf over documents, legs {k}", title_weight=2, document_idf=True, legs=k
        )
        for k in (30, 100)
    ),
)
"""The first round of variants, run while fused ties went to the item the dense leg met first."""

VARIANTS = (
    *(dataclasses.replace(v, ties="dense first met") for v in ROUND_1),
    *(
        Variant(f"round 2: {name}", title_weight=2, document_idf=True, **kw)
        for name, kw in (
            ("title twice + idf over documents (fused ties: keyword first)", {}),
            ("compounds whole and parts", {"words": "compounds"}),
            ("Greek letters by name", {"words": "greek"}),
            ("compounds + Greek letters", {"words": "compounds+greek"}),
            *((f"adjacent pairs {w}", {"bigrams": w}) for w in (0.1, 0.2, 0.3, 0.5)),
            ("legs of each document's best chunk", {"per_document": True}),
            ("compounds with a short or numeric part, whole and parts", {"words": "names"}),
            ("the same + Greek letters", {"words": "names+greek"}),
            ("adjacent pairs 0.05", {"bigrams": 0.05}),
            *((f"BM25+ delta {d}", {"delta": d}) for d in (0.25, 0.5, 1.0)),
            *((f"fused ties {t}", {"ties": t}) for t in ("dense first met", "row", "best rank")),
            *(
                (f"k1 {k1}, b {b}", {"k1": k1, "b": b})
                for k1 in (0.9, 1.2, 1.5, 2.0)
                for b in (0.6, 0.75, 0.9)
                if (k1, b) != (1.2, 0.75)
            ),
        )
    ),
)


class Counts:
    """One analyzer's word counts of every chunk: title and body apart, as a CSC matrix."""

    def __init__(self, titles: list[list[str]], bodies: list[list[str]]) -> None:
        self.vocab: dict[str, int] = {}
        self.title, self.body = self._counts(titles), self._counts(bodies)

    def _counts(self, texts: list[list[str]]) -> sp.csc_matrix:
        r, c, v = [], [], []
        for i, words in enumerate(texts):
            for w, n in Counter(words).items():
                r.append(i)
                c.append(self.vocab.setdefault(w, len(self.vocab)))
                v.append(n)
        return sp.csc_matrix((np.array(v, np.float32), (r, c)), shape=(len(texts), 2**23))

    def ids(self, words: list[str], query_tf: bool) -> list[int]:
        ids = [self.vocab[w] for w in words if w in self.vocab]
        return ids if query_tf else sorted(set(ids))


def pairs(words: list[str]) -> list[str]:
    return [f"{a} {b}" for a, b in itertools.pairwise(words)]


class Corpus:
    """Chunks as the index holds them: document, title, headings and text, vector."""

    def __init__(self, workdir: Path) -> None:
        db = sqlite3.connect(workdir / "index" / "index.sqlite3")
        files = {
            i: (p.removesuffix(".md"), t)
            for i, p, t in db.execute("SELECT id, path, title FROM files")
        }
        rows = db.execute(
            "SELECT file_id, headings, text, vector FROM chunks ORDER BY id"
        ).fetchall()
        self.doc = np.array([files[f][0] for f, *_ in rows])
        self.vectors = np.stack([np.frombuffer(v, dtype="<f4") for *_, v in rows])
        self.titles = [files[f][1] or "" for f, *_ in rows]
        self.bodies = ["\n".join([*json.loads(h), t]) for _, h, t, _ in rows]
        self.n = len(rows)
        _, doc_of = np.unique(self.doc, return_inverse=True)
        self.doc_of = doc_of
        self.docs = int(doc_of.max()) + 1
        self.grouping = sp.csr_matrix(
            (np.ones(self.n), (doc_of, np.arange(self.n))), shape=(self.docs, self.n)
        )
        self._counts: dict[str, Counts] = {}

    def counts(self, analyzer: str) -> Counts:
        """Word counts by `analyzer`; "pairs" counts adjacent word pairs (`tokens.words`)."""
        if analyzer not in self._counts:
            cut = (lambda t: pairs(tokens.words(t))) if analyzer == "pairs" else ANALYZERS[analyzer]
            self._counts[analyzer] = Counts(
                [cut(t) for t in self.titles], [cut(t) for t in self.bodies]
            )
        return self._counts[analyzer]

    def weights(self, v: Variant, c: Counts) -> sp.csc_matrix:
        """Each posting's BM25 term score under `v`: a query sums its terms' columns."""
        lt, lb = np.asarray(c.title.sum(1)).ravel(), np.asarray(c.body.sum(1)).ravel()
        if c is not self.counts(v.words):  # pairs: lengths in words, as the chunk's own
            words = self.counts(v.words)
            lt = np.asarray(words.title.sum(1)).ravel()
            lb = np.asarray(words.body.sum(1)).ravel()
        if v.bm25f:
            nt = 1 - v.title_b + v.title_b * lt / max(lt.mean(), 1e-9)
            nb = 1 - v.b + v.b * lb / lb.mean()
            tf = sp.diags(v.title_weight / nt) @ c.title + sp.diags(1 / nb) @ c.body
            norm = np.full(self.n, v.k1)
        else:
            tf = c.title * v.title_weight + c.body
            length = lt * v.title_weight + lb
            norm = v.k1 * (1 - v.b + v.b * length / length.mean())
        if v.context:
            whole = self.grouping.T @ (self.grouping @ c.body)
            tf = tf + v.context * (whole - c.body)
        tf = sp.csc_matrix(tf)
        if v.document_idf:
            held = sp.csc_matrix((self.grouping @ (tf > 0).astype(np.float32)) > 0)
            df, n = np.diff(held.indptr).astype(np.float64), self.docs
        else:
            df, n = np.diff(sp.csc_matrix(tf > 0).indptr).astype(np.float64), self.n
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        coo = tf.tocoo()
        w = idf[coo.col] * (v.delta + (v.k1 + 1) * coo.data / (coo.data + norm[coo.row]))
        return sp.csc_matrix((w.astype(np.float32), (coo.row, coo.col)), shape=tf.shape)


def top(
    scores: npt.NDArray[np.floating],
    k: int,
    positive: bool,
    doc_of: npt.NDArray[np.intp] | None = None,
) -> list[int]:
    """Rows of the k best scores, best first, ties to the lower row, as the index does;
    with `doc_of`, only each document's best row."""
    rows = np.flatnonzero(scores > 0) if positive else np.arange(len(scores))
    if doc_of is not None:
        ranked = rows[np.lexsort((rows, -scores[rows]))]
        _, first = np.unique(doc_of[ranked], return_index=True)
        return ranked[np.sort(first)][:k].tolist()
    if len(rows) > k:
        rows = rows[np.argpartition(-scores[rows], k - 1)[:k]]
    return rows[np.lexsort((rows, -scores[rows]))].tolist()


def fused(rankings: list[list[int]], ties: str) -> list[int]:
    """RRF k = 60 as `fusion.py`; equal fused scores in the order `ties` says."""
    if ties == "dense first met":
        return [r for r, _ in fusion.reciprocal_rank(rankings)]
    score = dict(fusion.reciprocal_rank(rankings))
    best = {}
    for ranking in reversed(rankings):
        for i, r in enumerate(ranking, start=1):
            best[r] = min(best.get(r, i), i)
    key = {"row": lambda r: r, "keyword first met": None, "best rank": lambda r: best[r]}[ties]
    if key is None:
        return [r for r, _ in fusion.reciprocal_rank(rankings[::-1])]
    return sorted(score, key=lambda r: (-score[r], key(r)))


def question_vectors(queries: dict[str, str], kept: Path) -> npt.NDArray[np.float32]:
    """The questions' vectors by the local model, kept in `kept` for the next run."""
    if kept.exists():
        return np.load(kept)
    with model_server() as url:
        items, out = list(queries.values()), []
        for i in range(0, len(items), 64):
            answer = httpx.post(
                f"{url}/v1/embeddings", json={"input": items[i : i + 64]}, timeout=600
            )
            out += [d["embedding"] for d in answer.json()["data"]]
    np.save(kept, np.array(out, dtype=np.float32))
    return np.load(kept)


def evaluate(
    corpus: Corpus, v: Variant, split: str, vectors: npt.NDArray[np.float32]
) -> dict[str, tuple[float, float]]:
    """(nDCG@10, MRR@10) of each mode."""
    queries, qrels = load_split(split)
    words = corpus.counts(v.words)
    weights = corpus.weights(v, words)
    two = corpus.counts("pairs") if v.bigrams else None
    two_weights = corpus.weights(v, two) if two is not None else None
    doc_of = corpus.doc_of if v.per_document else None
    totals = {m: np.zeros(2) for m in ("keyword", "dense", "hybrid")}
    for (qid, text), vector in zip(queries.items(), vectors, strict=True):
        ids = words.ids(ANALYZERS[v.words](text), v.query_tf)
        scores = np.asarray(weights[:, ids].sum(1)).ravel() if ids else np.zeros(corpus.n)
        if two is not None and two_weights is not None:
            pair_ids = two.ids(pairs(tokens.words(text)), False)
            if pair_ids:
                scores = scores + v.bigrams * np.asarray(two_weights[:, pair_ids].sum(1)).ravel()
        keyword = top(scores, v.legs, positive=True, doc_of=doc_of)
        dense = top(corpus.vectors @ vector, v.legs, positive=False, doc_of=doc_of)
        for mode, rows in (
            ("keyword", keyword),
            ("dense", dense),
            ("hybrid", fused([dense, keyword], v.ties)),
        ):
            ranked = list(dict.fromkeys(corpus.doc[rows[:10]].tolist()))
            totals[mode] += [ndcg_at(ranked, qrels[qid]), mrr_at(ranked, qrels[qid])]
    return {m: (t[0] / len(queries), t[1] / len(queries)) for m, t in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--split", choices=["train", "test"], default="train")
    parser.add_argument("--only", default="", help="the variants whose name holds this")
    args = parser.parse_args()
    corpus = Corpus(args.workdir)
    vectors = question_vectors(load_split(args.split)[0], args.workdir / f"q-{args.split}.npy")
    print("| variant | keyword nDCG@10 / MRR@10 | hybrid nDCG@10 / MRR@10 |\n|---|---|---|")
    for v in (v for v in VARIANTS if args.only in v.name):
        f = evaluate(corpus, v, args.split, vectors)
        print(
            f"| {v.name} | {f['keyword'][0]:.3f} / {f['keyword'][1]:.3f} "
            f"| {f['hybrid'][0]:.3f} / {f['hybrid'][1]:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
