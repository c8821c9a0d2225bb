"""The Search page: one or several bases, their results merged, Compare of the modes.

`metis serve` serves it for its one base (`add_search_page`); the cluster console
(`metis-console`, metis_operator/console/) serves it for every base it sees, with the
same page (pages.py), decisions (views.py) and searches (asking.py), beside its own
Bases pages.
"""

from __future__ import annotations

from metis_indexer.console.app import add_search_page

__all__ = ["add_search_page"]
