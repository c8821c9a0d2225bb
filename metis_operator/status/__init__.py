"""A base's status, top down: `announce` (what a step of a base's loop writes and says:
the status, the lines, the Events), `write` (the one writer: the difference, then the
lines and Events in order), `compose` (the status from a verdict and an observation, and
the difference), `quality` (the QualityRegressed condition an evaluation sets)."""
