"""What reading a document's stream gives: entries, snapshots, and the two
ways a read can find history gone.

Below :mod:`yrelay.storage.reads` so that the modules the store builds on (the
clocks rebuild, the deletion marker) can name an entry without importing
the store; the store re-exports every name here.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from yrelay.storage.offsets import StreamId
from yrelay.storage.replies import text


class Entry:
    """One stream entry: a Yjs update and the session that sent it.

    ``b64`` is computed once and shared by every subscriber it is sent to.
    """

    __slots__ = ("id", "update", "session", "_b64")

    def __init__(self, entry_id: StreamId, update: bytes, session: str):
        self.id = entry_id
        self.update = update
        self.session = session
        self._b64: str | None = None

    @property
    def b64(self) -> str:
        if self._b64 is None:
            self._b64 = base64.b64encode(self.update).decode("ascii")
        return self._b64

    def __repr__(self) -> str:
        return f"Entry({self.id}, {len(self.update)} bytes, from {self.session})"


class HistoryTrimmed(Exception):
    """The entries right after the requested offset were compacted away."""

    def __init__(self, doc: str, after: StreamId, trimmed_through: StreamId):
        super().__init__(f"{doc}: entries after {after} trimmed through {trimmed_through}")
        self.trimmed_through = trimmed_through


class StreamRewound(Exception):
    """The entry a reader continues from is no longer in the stream (and was
    not trimmed): the stream went back (a failover to a replica that lagged,
    a restore), so what follows it now does not follow what the reader was
    sent, and the reader may hold entries the stream lost."""

    def __init__(self, doc: str, after: StreamId):
        super().__init__(f"{doc}: entry {after} is gone from the stream (not trimmed)")
        self.after = after


@dataclass(frozen=True)
class Snapshot:
    """The document folded up to ``offset`` (empty bytes when there is none)."""

    offset: StreamId
    update: bytes


def to_entry(entry_id: bytes, fields: dict[bytes, bytes]) -> Entry:
    return Entry(StreamId.parse(text(entry_id)), fields.get(b"u", b""), fields.get(b"s", b"").decode())
