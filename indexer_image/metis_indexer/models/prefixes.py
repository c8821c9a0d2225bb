"""Default query and document prefixes by embedding model (`embedding.*_prefix` of the
configuration).

Each model family was trained with its own markers; the wrong one costs recall,
so the indexer picks them from the model's id unless the configuration sets them.
"""

from __future__ import annotations

import re

BGE_INSTRUCTION = "Represent this sentence for searching relevant passages: "
QWEN3_INSTRUCTION = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: "
)

# (pattern on the lower-cased model id, query prefix, document prefix); first match wins.
_TABLE: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"nomic-embed-text"), "search_query: ", "search_document: "),
    (re.compile(r"embeddinggemma"), "task: search result | query: ", "title: none | text: "),
    (re.compile(r"qwen3-embedding"), QWEN3_INSTRUCTION, ""),
    (re.compile(r"(^|[/_-])(multilingual-)?e5([-_]|$)"), "query: ", "passage: "),
    (re.compile(r"bge-m3"), "", ""),
    (re.compile(r"bge-[a-z]+-en|bge-en"), BGE_INSTRUCTION, ""),
    (re.compile(r"mxbai-embed"), BGE_INSTRUCTION, ""),
    (re.compile(r"arctic-embed"), BGE_INSTRUCTION, ""),
)


def default_prefixes(model_id: str) -> tuple[str, str]:
    """(query prefix, document prefix) the model was trained with; none for others."""
    name = model_id.lower()
    for pattern, query, document in _TABLE:
        if pattern.search(name):
            return query, document
    return "", ""
