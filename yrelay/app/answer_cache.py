"""Recent sync answers, so an answer that has not changed is not computed again.

A sync answer (what a state vector lacks: ``/yws`` sync step 1, ``/ws``
``sync``) costs a read of the whole stream and a diff in an engine worker,
and is often the same: every new client of a document sends the same empty
state vector, and a hostile one may send one state vector again and again
(issue 30's amplifiers). An answer is kept by document and state vector
with the id of the last entry folded into it; it is served again, instead
of a diff in an engine worker, when the entries read for a request end at
that id (nothing was appended since; a deleted document starts again below
any id it had). The stream is still read for every request: a Redis round
trip, where the diff is a worker's CPU. Bounded in entries and in bytes (keys
included), least recently used first out; state vectors longer than
:data:`MAX_KEY_BYTES` are not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["AnswerCache"]

#: State vectors longer than this are not kept (a real one is ~10 bytes
#: per Yjs client; a /yws step 1 may carry up to max_update_bytes).
MAX_KEY_BYTES = 4 * 1024

A = TypeVar("A")


class AnswerCache(Generic[A]):
    """Answers by ``(doc, state_vector)``, each valid for one last id."""

    def __init__(self, max_bytes: int = 16 * 1024 * 1024, max_entries: int = 256):
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, bytes], tuple[str, A, int]] = OrderedDict()
        self._bytes = 0

    def get(self, doc: str, state_vector: bytes, last: str | None) -> A | None:
        """The answer kept for this state vector, if ``last`` (the stream's
        last id now) is the last entry folded into it."""
        key = (doc, state_vector)
        kept = self._entries.get(key)
        if kept is None or last is None or kept[0] != last:
            return None
        self._entries.move_to_end(key)
        return kept[1]

    def put(self, doc: str, state_vector: bytes, last: str | None, answer: A, size: int) -> None:
        """Keep ``answer`` (``size`` bytes), computed from the entries up to
        ``last``; too large ones (or keys) are not kept."""
        size += len(state_vector) + len(doc)
        if last is None or len(state_vector) > MAX_KEY_BYTES or size > self.max_bytes // 4:
            return
        key = (doc, state_vector)
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[2]
        self._entries[key] = (last, answer, size)
        self._bytes += size
        while self._entries and (self._bytes > self.max_bytes or len(self._entries) > self.max_entries):
            _, (_, _, dropped) = self._entries.popitem(last=False)
            self._bytes -= dropped
