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
  digest), and updates that may be pending in the document (neither engine's
  ``encode_state`` carries them, see :class:`yrelay.yjs.crdt.Replica`);
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

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from yrelay import protocol

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
    #: Remote updates the document may hold as pending (not in ``state``).
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
        self._seq = 0
        self._journal: BinaryIO | None = None

    def load(self) -> PersistedState | None:
        """The last snapshot with the journal after it, or None when there is
        neither (a snapshot of another version counts as none)."""
        covered = 0
        state = None
        with contextlib.suppress(FileNotFoundError):
            raw = json.loads(self.path.read_text())
            if raw.get("version") == VERSION:
                state, covered = _decode(raw), int(raw["journal_seq"])
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
        self._journal.write(_dumps({"seq": self._seq, **asdict(update)}) + b"\n")
        self._journal.flush()
        if self.fsync:
            os.fsync(self._journal.fileno())

    def save(self, state: PersistedState) -> None:
        """Replace the snapshot; it covers every update journaled so far."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        data = _dumps({**_encode(state), "journal_seq": self._seq})
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
                records.append((int(raw["seq"]), _update_of(raw)))
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line: never sent
        return records


def _dumps(value: dict[str, Any]) -> bytes:
    """Compact JSON; bytes (updates, states) as base64."""
    return json.dumps(value, separators=(",", ":"), default=protocol.b64encode).encode()


def _encode(state: PersistedState) -> dict[str, Any]:
    wire = asdict(state)
    del wire["journal"]  # on load only
    return {"version": VERSION, **wire}


def _update_of(raw: dict[str, Any]) -> PersistedUpdate:
    return PersistedUpdate(int(raw["clock"]), raw["doc"], protocol.b64decode(raw["update"]))


def _document_of(raw: dict[str, Any]) -> PersistedDocument:
    suspects = [protocol.b64decode(update) for update in raw["suspects"]]
    return PersistedDocument(**{**raw, "state": protocol.b64decode(raw["state"]), "suspects": suspects})


def _decode(raw: dict[str, Any]) -> PersistedState:
    documents = [_document_of(doc) for doc in raw["documents"]]
    return PersistedState(raw["session"], int(raw["clock"]), documents, [_update_of(item) for item in raw["pending"]])
