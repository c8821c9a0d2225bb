"""Search: hybrid search (modes, degradation, fusion, reranking), snippets, and the
evaluation of a base against its question set."""
