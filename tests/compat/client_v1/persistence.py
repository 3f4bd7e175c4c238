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
  them, see :class:`yrelay.yjs.crdt.Replica`);
- the send buffer (updates not yet acked).

Two files, so that the cost of an edit does not grow with the document:

- a **snapshot** (``state.json``) of all of the above, replaced whole (temp
  file, fsync, rename, fsync of the directory: a crash leaves the previous
  one or the new one, never a torn file) a short while after anything changed;
- a **journal** (``state.json.journal``): every local update, appended and
  fsynced *before* it is sent. So an edit the server acknowledges is always on
  disk, and the restarted client holds it (the server never delivers a
  session's own entries back). Each line carries a sequence number; a snapshot
  records the last one it covers and empties the journal, so a crash between
  the two replays nothing twice. A torn last line was never sent and is skipped.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

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
    #: Local updates journaled after the snapshot (on load only): to apply to
    #: their documents and send, like ``pending``.
    journal: list[PersistedUpdate] = field(default_factory=list)


class ClientStateFile:
    """One client's snapshot and journal; ``save`` replaces the snapshot
    atomically, ``append`` journals one local update durably."""

    def __init__(self, path: str | Path, *, fsync: bool = True):
        self.path = Path(path)
        self.journal_path = self.path.with_name(self.path.name + ".journal")
        self.fsync = fsync
        self.saves = 0
        self._seq = 0
        self._journal: BinaryIO | None = None

    def load(self) -> PersistedState | None:
        """The last snapshot with the journal after it, or None when there is
        neither (a snapshot of another version counts as none)."""
        covered = 0
        state = None
        try:
            raw = json.loads(self.path.read_text())
            if raw.get("version") == VERSION:
                state, covered = _decode(raw), int(raw["journal_seq"])
        except FileNotFoundError:
            pass
        journal = [(seq, update) for seq, update in self._read_journal() if seq > covered]
        self._seq = max([covered, *(seq for seq, _ in journal)])
        if state is None and not journal:
            return None
        state = state or PersistedState(None, 0, [], [])
        state.journal = [update for _, update in journal]
        return state

    def append(self, update: PersistedUpdate) -> None:
        """Journal one local update; it is on disk when this returns."""
        if self._journal is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._journal = open(self.journal_path, "ab")
        self._seq += 1
        record = {"seq": self._seq, "clock": update.clock, "doc": update.doc, "update": _b64(update.update)}
        self._journal.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
        self._journal.flush()
        if self.fsync:
            os.fsync(self._journal.fileno())

    def save(self, state: PersistedState) -> None:
        """Replace the snapshot; it covers every update journaled so far."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        data = json.dumps({**_encode(state), "journal_seq": self._seq}, separators=(",", ":")).encode()
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
        if self._journal is not None:
            self._journal.truncate(0)  # append mode: the next write starts at the new end
        elif self.journal_path.exists():
            self.journal_path.write_bytes(b"")
        self.saves += 1

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def _read_journal(self) -> list[tuple[int, PersistedUpdate]]:
        try:
            lines = self.journal_path.read_bytes().splitlines()
        except FileNotFoundError:
            return []
        records = []
        for line in lines:
            try:
                raw = json.loads(line)
                records.append((int(raw["seq"]), PersistedUpdate(int(raw["clock"]), raw["doc"], _unb64(raw["update"]))))
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line: never sent
        return records


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
            {
                "name": doc.name,
                "state": _b64(doc.state),
                "offset": doc.offset,
                "since": doc.since,
                "held": doc.held,
                "suspects": [_b64(update) for update in doc.suspects],
                "needs_sync": doc.needs_sync,
            }
            for doc in state.documents
        ],
        "pending": [{"clock": item.clock, "doc": item.doc, "update": _b64(item.update)} for item in state.pending],
    }


def _decode(raw: dict[str, Any]) -> PersistedState:
    return PersistedState(
        session=raw["session"],
        clock=int(raw["clock"]),
        documents=[
            PersistedDocument(
                doc["name"],
                _unb64(doc["state"]),
                doc["offset"],
                doc["since"],
                list(doc["held"]),
                [_unb64(update) for update in doc["suspects"]],
                bool(doc["needs_sync"]),
            )
            for doc in raw["documents"]
        ],
        pending=[PersistedUpdate(int(item["clock"]), item["doc"], _unb64(item["update"])) for item in raw["pending"]],
    )
