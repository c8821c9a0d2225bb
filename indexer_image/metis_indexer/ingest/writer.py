"""A pass's writes, several documents to a transaction.

Documents come from the pass as they finish embedding; the writer takes all that
wait (up to `MOST` at once) and writes them in one transaction, each in its own
savepoint (`Index.put_documents`), while the next ones embed. One commit per
group rather than per document is what keeps writing off a pass's critical path;
a kill loses only the documents of the group in flight, which the next pass reads
again.
"""

from __future__ import annotations

import asyncio
import dataclasses

from metis_indexer.index.memory import Index, Replacement

MOST = 32
"""Documents written in one transaction at most: a few thousand chunks, a few MB."""


@dataclasses.dataclass(slots=True)
class _Waiting:
    document: Replacement
    done: asyncio.Future[None]


class GroupWriter:
    """Writes documents for one pass; `put` returns once its document is written (or
    raises its error). Run `run` as a task for the pass's length."""

    def __init__(self, index: Index, most: int = MOST) -> None:
        self.index = index
        self.most = most
        self._waiting: list[_Waiting] = []
        self._arrived = asyncio.Event()

    async def put(self, document: Replacement) -> None:
        """Write one document (in a group with whatever else waits); its own error, such
        as text the store cannot hold, or the index's (a full drive), is raised here."""
        done = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(document, done))
        self._arrived.set()
        await done

    async def run(self) -> None:
        while True:
            await self._arrived.wait()
            group, self._waiting = self._waiting[: self.most], self._waiting[self.most :]
            if not self._waiting:
                self._arrived.clear()
            group = [w for w in group if not w.done.done()]  # a cancelled document is not written
            if not group:
                continue
            try:
                errors = await asyncio.to_thread(
                    self.index.put_documents, [w.document for w in group]
                )
            except Exception as e:  # the index's own trouble: every document of the group
                for w in group:
                    if not w.done.done():
                        w.done.set_exception(e)
                continue
            for w, error in zip(group, errors, strict=True):
                if w.done.done():
                    continue
                if error is None:
                    w.done.set_result(None)
                else:
                    w.done.set_exception(error)
