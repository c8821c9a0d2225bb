import pytest

from metis_indexer.models.prefixes import BGE_INSTRUCTION, QWEN3_INSTRUCTION, default_prefixes


@pytest.mark.parametrize(
    ("model", "query", "document"),
    [
        ("nomic-ai/nomic-embed-text-v1.5", "search_query: ", "search_document: "),
        ("intfloat/multilingual-e5-large", "query: ", "passage: "),
        ("intfloat/e5-small-v2", "query: ", "passage: "),
        ("Qwen/Qwen3-Embedding-0.6B", QWEN3_INSTRUCTION, ""),
        ("BAAI/bge-small-en-v1.5", BGE_INSTRUCTION, ""),
        ("mixedbread-ai/mxbai-embed-large-v1", BGE_INSTRUCTION, ""),
        ("Snowflake/snowflake-arctic-embed-m", BGE_INSTRUCTION, ""),
        ("google/embeddinggemma-300m", "task: search result | query: ", "title: none | text: "),
        ("BAAI/bge-m3", "", ""),
        ("sentence-transformers/all-MiniLM-L6-v2", "", ""),
        ("ibm-granite/granite-embedding-125m-english", "", ""),
        ("some-model-e5000", "", ""),
    ],
)
def test_prefixes_follow_the_model_family(model, query, document):
    assert default_prefixes(model) == (query, document)
