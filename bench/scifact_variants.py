"""Keyword and fusion variants on SciFact, scored outside the indexer (issue 15's experiments).

Reads the chunks and vectors of a work folder `bench/scifact.py --workdir DIR` indexed, and
re-implements the keyword leg with numpy and scipy over the very same chunks (their words by
`tokens.words`), so a variant costs seconds, not a pass: on the product's formula it gives
what `bench/scifact.py` gives (keyword 0.658 on train). Documents count by their best chunk
in the top 10, as the benchmark counts them. Tune on `--split train`; the test split is for
reporting a change kept.

    .venv/bin/python bench/scifact_variants.py --workdir DIR [--split train]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sqlite3
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from scifact import load_split, model_server, mrr_at, ndcg_at

from metis_indexer.index import tokens


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


VARIANTS = (
    Variant("before: one field, idf over chunks"),
    Variant("title twice", title_weight=2),
    Variant("title 3 times", title_weight=3),
    *(Variant(f"BM25F title {w}, title b {tb}", title_weight=w, bm25f=True, title_b=tb)
      for w in (1, 1.5, 2, 3) for tb in (0.3, 0.75)),
    Variant("idf over documents", document_idf=True),
    Variant("title twice + idf over documents", title_weight=2, document_idf=True),
    *(Variant(f"title twice, k1 {k1}, b {b}", title_weight=2, k1=k1, b=b)
      for k1 in (0.9, 1.5) for b in (0.6, 0.9)),
    Variant("query tf", query_tf=True),
    *(Variant(f"document context {c}", context=c) for c in (0.2, 0.5, 1.0)),
    *(Variant(f"title twice + idf over documents, legs {k}", title_weight=2, document_idf=True,
              legs=k) for k in (30, 100)),
)


class Corpus:
    """Chunks as the index holds them: document, title, headings and text, vector."""

    def __init__(self, workdir: Path) -> None:
        db = sqlite3.connect(workdir / "index" / "index.sqlite3")
        files = {i: (p.removesuffix(".md"), t) for i, p, t in
                 db.execute("SELECT id, path, title FROM files")}
        rows = db.execute(
            "SELECT file_id, headings, text, vector FROM chunks ORDER BY id"
        ).fetchall()
        self.doc = np.array([files[f][0] for f, *_ in rows])
        self.vectors = np.stack([np.frombuffer(v, dtype="<f4") for *_, v in rows])
        self.vocab: dict[str, int] = {}
        titles = [tokens.words(files[f][1] or "") for f, *_ in rows]
        bodies = [tokens.words("\n".join([*json.loads(h), t])) for _, h, t, _ in rows]
        self.title, self.body = self._counts(titles), self._counts(bodies)
        self.n = len(rows)
        _, doc_of = np.unique(self.doc, return_inverse=True)
        self.docs = int(doc_of.max()) + 1
        self.grouping = sp.csr_matrix((np.ones(self.n), (doc_of, np.arange(self.n))),
                                      shape=(self.docs, self.n))

    def _counts(self, texts: list[list[str]]) -> sp.csc_matrix:
        r, c, v = [], [], []
        for i, words in enumerate(texts):
            for w, n in Counter(words).items():
                r.append(i)
                c.append(self.vocab.setdefault(w, len(self.vocab)))
                v.append(n)
        return sp.csc_matrix((np.array(v, np.float32), (r, c)), shape=(len(texts), 2**22))

    def weights(self, v: Variant) -> sp.csc_matrix:
        """Each posting's BM25 term score under `v`: a query sums its terms' columns."""
        lt, lb = np.asarray(self.title.sum(1)).ravel(), np.asarray(self.body.sum(1)).ravel()
        if v.bm25f:
            nt = 1 - v.title_b + v.title_b * lt / max(lt.mean(), 1e-9)
            nb = 1 - v.b + v.b * lb / lb.mean()
            tf = sp.diags(v.title_weight / nt) @ self.title + sp.diags(1 / nb) @ self.body
            norm = np.full(self.n, v.k1)
        else:
            tf = self.title * v.title_weight + self.body
            length = lt * v.title_weight + lb
            norm = v.k1 * (1 - v.b + v.b * length / length.mean())
        if v.context:
            whole = self.grouping.T @ (self.grouping @ self.body)
            tf = tf + v.context * (whole - self.body)
        tf = sp.csc_matrix(tf)
        if v.document_idf:
            held = sp.csc_matrix((self.grouping @ (tf > 0).astype(np.float32)) > 0)
            df, n = np.diff(held.indptr).astype(np.float64), self.docs
        else:
            df, n = np.diff(sp.csc_matrix(tf > 0).indptr).astype(np.float64), self.n
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        coo = tf.tocoo()
        w = idf[coo.col] * (v.k1 + 1) * coo.data / (coo.data + norm[coo.row])
        return sp.csc_matrix((w.astype(np.float32), (coo.row, coo.col)), shape=tf.shape)

    def term_ids(self, text: str, query_tf: bool) -> list[int]:
        ids = [self.vocab[w] for w in tokens.words(text) if w in self.vocab]
        return ids if query_tf else sorted(set(ids))


def top(scores: npt.NDArray[np.floating], k: int, positive: bool) -> list[int]:
    """Rows of the k best scores, best first, ties to the lower row, as the index does."""
    rows = np.flatnonzero(scores > 0) if positive else np.arange(len(scores))
    if len(rows) > k:
        rows = rows[np.argpartition(-scores[rows], k - 1)[:k]]
    return rows[np.lexsort((rows, -scores[rows]))].tolist()


def fused(rankings: list[list[int]], k: int = 60) -> list[int]:
    score: dict[int, float] = {}
    for ranking in rankings:
        for i, r in enumerate(ranking, start=1):
            score[r] = score.get(r, 0.0) + 1.0 / (k + i)
    return [r for r, _ in sorted(score.items(), key=lambda x: (-x[1], x[0]))]


def question_vectors(queries: dict[str, str]) -> npt.NDArray[np.float32]:
    with model_server() as url:
        items, out = list(queries.values()), []
        for i in range(0, len(items), 64):
            answer = httpx.post(f"{url}/v1/embeddings", json={"input": items[i : i + 64]},
                                timeout=600)
            out += [d["embedding"] for d in answer.json()["data"]]
    return np.array(out, dtype=np.float32)


def evaluate(corpus: Corpus, v: Variant, split: str,
             vectors: npt.NDArray[np.float32]) -> dict[str, tuple[float, float]]:
    """(nDCG@10, MRR@10) of each mode."""
    queries, qrels = load_split(split)
    weights = corpus.weights(v)
    totals = {m: np.zeros(2) for m in ("keyword", "dense", "hybrid")}
    for (qid, text), vector in zip(queries.items(), vectors, strict=True):
        ids = corpus.term_ids(text, v.query_tf)
        scores = np.asarray(weights[:, ids].sum(1)).ravel() if ids else np.zeros(corpus.n)
        keyword = top(scores, v.legs, positive=True)
        dense = top(corpus.vectors @ vector, v.legs, positive=False)
        for mode, rows in (("keyword", keyword), ("dense", dense),
                           ("hybrid", fused([dense, keyword]))):
            ranked = list(dict.fromkeys(corpus.doc[rows[:10]].tolist()))
            totals[mode] += [ndcg_at(ranked, qrels[qid]), mrr_at(ranked, qrels[qid])]
    return {m: (t[0] / len(queries), t[1] / len(queries)) for m, t in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--split", choices=["train", "test"], default="train")
    args = parser.parse_args()
    corpus = Corpus(args.workdir)
    vectors = question_vectors(load_split(args.split)[0])
    print("| variant | keyword nDCG@10 / MRR@10 | hybrid nDCG@10 / MRR@10 |\n|---|---|---|")
    for v in VARIANTS:
        f = evaluate(corpus, v, args.split, vectors)
        print(f"| {v.name} | {f['keyword'][0]:.3f} / {f['keyword'][1]:.3f} "
              f"| {f['hybrid'][0]:.3f} / {f['hybrid'][1]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
