"""What a client must not forget across a crash, in one file written atomically.

A client process that is killed and restarted should come back as the same
session, with the same documents, and send again every update the server has
not acknowledged. That needs:

- the session id (to resume, so the server's dedup answers resends with the
  original ids and the tracker keeps the offsets);
- the logical clock: a restarted client reusing a clock of its session would
  have a *new* update answered as a duplicate of an old one, i.e. acked and
  never stored;
- per document, the Yjs state, the offset and held stream ids (the drift
  digest), and updates that may be pending in y-py (``encode_state`` drops
  them, see :class:`yrelay.crdt.Replica`);
- the send buffer (updates not yet acked).

The client writes it *before* it sends a local update (write-ahead: an edit the
server acknowledges is always in the file, so the restarted client holds it
and never needs it delivered back, which the server would not do for the
session's own entries), and a short while after any other change. Writes are
whole-file: temp file, fsync, rename, fsync of the directory, so a crash
leaves either the previous state or the new one, never a torn file.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Format of the file; a file of another version is ignored (the client starts fresh).
VERSION = 1


@dataclass
class PersistedDocument:
    name: str
    state: bytes
    offset: str | None
    #: HeldEntries' base and ids (stream ids as strings).
    since: str
    held: list[str]
    #: Remote updates y-py may hold as pending (not in ``state``).
    suspects: list[bytes] = field(default_factory=list)
    needs_sync: bool = False


@dataclass
class PersistedUpdate:
    clock: int
    doc: str
    update: bytes


@dataclass
class PersistedState:
    session: str | None
    #: The last clock the send buffer issued.
    clock: int
    documents: list[PersistedDocument]
    #: Unacked updates with their clocks, then local edits not yet given a
    #: clock (batched) with clock 0.
    pending: list[PersistedUpdate]


class ClientStateFile:
    """One client's state file; ``save`` replaces it atomically."""

    def __init__(self, path: str | Path, *, fsync: bool = True):
        self.path = Path(path)
        self.fsync = fsync
        self.saves = 0

    def load(self) -> PersistedState | None:
        """The last saved state, or None when there is none (or not of this version)."""
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        if raw.get("version") != VERSION:
            return None
        return _decode(raw)

    def save(self, state: PersistedState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        data = json.dumps(_encode(state), separators=(",", ":")).encode()
        with open(temporary, "wb") as handle:
            handle.write(data)
            if self.fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        if self.fsync:
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        self.saves += 1


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def _encode(state: PersistedState) -> dict[str, Any]:
    return {
        "version": VERSION,
        "session": state.session,
        "clock": state.clock,
        "documents": [
            {"name": doc.name, "state": _b64(doc.state), "offset": doc.offset, "since": doc.since,
             "held": doc.held, "suspects": [_b64(update) for update in doc.suspects], "needs_sync": doc.needs_sync}
            for doc in state.documents
        ],
        "pending": [{"clock": item.clock, "doc": item.doc, "update": _b64(item.update)} for item in state.pending],
    }


def _decode(raw: dict[str, Any]) -> PersistedState:
    return PersistedState(
        session=raw["session"],
        clock=int(raw["clock"]),
        documents=[
            PersistedDocument(doc["name"], _unb64(doc["state"]), doc["offset"], doc["since"], list(doc["held"]),
                              [_unb64(update) for update in doc["suspects"]], bool(doc["needs_sync"]))
            for doc in raw["documents"]
        ],
        pending=[PersistedUpdate(int(item["clock"]), item["doc"], _unb64(item["update"])) for item in raw["pending"]],
    )
