"""Ingest: the sources walked, documents read and cut into chunks, a pass planned and run,
its documents written to the index a group at a time."""
