"""The heading path at a point of a document, shared by the readers that cut at headings."""

from __future__ import annotations


class Outline:
    """Headings above the current point, outermost first.

    A heading closes every open heading of its level or deeper, so `# A`, `### B`,
    `## C` gives A › C, as a reader of the document sees it.
    """

    def __init__(self) -> None:
        self._open: list[tuple[int, str]] = []
        self.first_h1: str | None = None
        """The first level-1 heading: a document's title when it declares none."""

    def enter(self, level: int, name: str) -> None:
        while self._open and self._open[-1][0] >= level:
            self._open.pop()
        self._open.append((level, name))
        if level == 1 and self.first_h1 is None:
            self.first_h1 = name

    @property
    def headings(self) -> tuple[str, ...]:
        return tuple(name for _, name in self._open)
