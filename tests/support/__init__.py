"""Helpers that test folders share (plain Python, no pytest fixtures)."""
