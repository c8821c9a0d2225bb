"""Metis indexer: reads source drives into cited chunks, keeps the index, answers searches."""
