"""Models: the clients of the embedding model and the reranker, their prefixes, and the
local model server (`metis models`)."""
