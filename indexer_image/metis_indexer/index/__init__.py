"""The index: the store on disk (SQLite), the index held in memory for search, BM25 postings
and the words they are made of."""
