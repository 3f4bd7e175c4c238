"""Reassembly of one update sent in parts (feature ``update_parts``).

An update larger than a websocket frame arrives as ``parts`` consecutive
``update`` frames with the same doc and clock, ``part`` = 0 .. parts-1
(docs/protocol.md#large-updates). A connection reassembles at most one such
update at a time; frames of plain updates (other documents) may come in
between. The buffer never holds more than ``max_update_bytes``: a part that
would cross it is refused before it is kept. A part out of order, a change
of doc, clock or ``parts`` mid-way, or parts of another update while one is
open discard what was buffered, with an ``error`` naming the discarded
update's doc and clock, so the client knows to send it again from part 0
(``unavailable`` when another update's part broke in: this one was fine).
One error per broken update: its remaining parts, already on their way, are
ignored until it starts again at part 0. All connections of a process
together hold at most ``PROCESS_PARTS_BYTES`` of parts: past it a part is
refused with ``unavailable`` (resend later), so many connections that open
large updates and never finish cannot exhaust memory. One user's
connections (its subject) hold at most ``SUBJECT_UPDATES_IN_PARTS`` updates'
worth (``max_update_bytes`` each) of it: without a share, 17 connections of
one token holding 15 MiB each, never finished, took the whole budget for as
long as they stayed open, and every other user's update in parts was
refused ``unavailable`` all that time (issue 36).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from yrelay.protocol import ErrorCode, ProtocolError, Update

log = logging.getLogger(__name__)

Reject = Callable[[ProtocolError], Awaitable[None]]

#: Bytes of parts all connections of one process may hold at once.
PROCESS_PARTS_BYTES = 256 * 1024 * 1024
#: ... and all connections of one user (subject) at most this many updates
#: of ``max_update_bytes`` (64 MiB by default: a quarter of the process's).
SUBJECT_UPDATES_IN_PARTS = 4


class PartsBudget:
    """Bytes held in parts across a process's connections, and by each
    owner (a user's connections together)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        #: Bytes held per owner; an owner holding none is not kept.
        self._owners: dict[str, int] = {}

    def refusal(self, owner: str, size: int, owner_limit: int) -> str | None:
        """Why ``owner`` may not hold ``size`` more bytes, at most
        ``owner_limit`` of its own (None: it may)."""
        if self._owners.get(owner, 0) + size > owner_limit:
            return "your connections hold too many updates in parts; resend later"
        if self.held + size > self.limit:
            return "the server holds too many updates in parts; resend later"
        return None

    def take(self, owner: str, size: int) -> None:
        self.held += size
        self._owners[owner] = self._owners.get(owner, 0) + size

    def give_back(self, owner: str, size: int) -> None:
        self.held -= size
        left = self._owners.get(owner, 0) - size
        if left > 0:
            self._owners[owner] = left
        else:
            self._owners.pop(owner, None)


#: The process's budget (one event loop per server process).
PROCESS_BUDGET = PartsBudget(PROCESS_PARTS_BYTES)


@dataclass
class _Open:
    """The update being reassembled."""

    doc: str
    clock: int
    parts: int
    sync: bool
    owner: str  # whose share of the budget its bytes are
    received: int = 0  # parts kept so far (the next expected index)
    size: int = 0
    slices: list[bytes] = field(default_factory=list)

    def same_update(self, frame: Update) -> bool:
        return (frame.doc, frame.clock, frame.parts, frame.sync) == (self.doc, self.clock, self.parts, self.sync)


class UpdateParts:
    """One connection's update in parts; ``reject`` sends an error frame;
    ``owner`` names whose share of the budget it takes (the connection's
    subject, asked when an update starts: known only after ``hello``; by
    default the connection alone)."""

    def __init__(
        self,
        max_update_bytes: int,
        reject: Reject,
        budget: PartsBudget = PROCESS_BUDGET,
        owner: Callable[[], str] | None = None,
    ):
        self.max_update_bytes = max_update_bytes
        self._reject = reject
        self._budget = budget
        self._owner = owner or (lambda: f"connection:{id(self)}")
        self._owner_limit = SUBJECT_UPDATES_IN_PARTS * max_update_bytes
        self._open: _Open | None = None
        #: The last update refused (doc, clock): its remaining parts, already
        #: on their way, are ignored until the client starts it again at part 0.
        self._skip: tuple[str, int] | None = None

    async def feed(self, frame: Update, data: bytes) -> bytes | None:
        """``data`` is the frame's decoded payload. A plain update is returned
        as is; a part is kept and None returned, until the last part, which
        returns the whole update. Raises :class:`ProtocolError` about this
        frame's update; an error about another update it discards is sent
        through ``reject``."""
        if frame.part is None and frame.parts is None:
            return data
        current = self._open
        if current is not None and (current.doc, current.clock) != (frame.doc, frame.clock):
            await self.discard(f"a part of clock {frame.clock} of {frame.doc!r} arrived")
        elif current is not None and not (current.same_update(frame) and frame.part == current.received):
            self._drop()  # out of order, or changed mid-way: this frame's error says so
            if frame.part != 0 or frame.parts is None:
                raise ProtocolError.about(
                    frame,
                    ErrorCode.MALFORMED_FRAME,
                    f"part {frame.part} (of {frame.parts}) arrived "
                    f"instead of part {current.received} of {current.parts}; the parts received "
                    "were discarded: send the update again from part 0",
                )
            # part 0 again: the client starts this update over (e.g. after rate_limited)
        if frame.part is None or frame.parts is None or frame.part >= frame.parts:
            raise ProtocolError.about(
                frame, ErrorCode.MALFORMED_FRAME, "part and parts go together, with 0 <= part < parts"
            )
        if self._open is None:
            if frame.part != 0:
                raise ProtocolError.about(
                    frame, ErrorCode.MALFORMED_FRAME, f"part {frame.part} without part 0 before it"
                )
            self._open = _Open(frame.doc, frame.clock, frame.parts, frame.sync, self._owner())
        return self._keep(self._open, frame, data)

    def _keep(self, current: _Open, frame: Update, data: bytes) -> bytes | None:
        if current.size + len(data) > self.max_update_bytes:  # refused before it is kept
            self._drop()
            raise ProtocolError.about(
                frame, ErrorCode.UPDATE_TOO_LARGE, f"update exceeds {self.max_update_bytes} bytes"
            )
        refusal = self._budget.refusal(current.owner, len(data), self._owner_limit)
        if refusal is not None:
            self._drop()
            raise ProtocolError.about(frame, ErrorCode.UNAVAILABLE, refusal)
        self._budget.take(current.owner, len(data))
        current.slices.append(data)
        current.size += len(data)
        current.received += 1
        if current.received < current.parts:
            return None
        self._drop()
        return b"".join(current.slices)

    def ignored(self, frame: Update) -> bool:
        """Is ``frame`` one of the remaining parts of an update that was
        refused? The client was told; it sends the update again from part 0.
        (Checked before the connection's own checks, so that they do not
        answer each remaining part once more.)"""
        if frame.part is None and frame.parts is None:
            return False
        if self._skip == (frame.doc, frame.clock) and frame.part != 0:
            return True
        self._skip = None
        return False

    def refused(self, error: ProtocolError) -> None:
        """An error about an update was sent (here, or by the connection
        before the part reached :meth:`feed`: ``rate_limited``, bad base64,
        ...): what was received of it is dropped, and the rest of its parts
        is ignored rather than answered one error each."""
        if error.doc is None or error.clock is None:
            return
        if self._open is not None and (self._open.doc, self._open.clock) == (error.doc, error.clock):
            self._drop()
        self._skip = (error.doc, error.clock)

    def _drop(self) -> _Open | None:
        """Forget the open update; its bytes go back to the process's budget."""
        current, self._open = self._open, None
        if current is not None:
            self._budget.give_back(current.owner, current.size)
        return current

    async def discard(self, why: str) -> None:
        """Drop the open update and tell the client to send it again: it was
        not at fault (``unavailable``, which clients resend), the frame that
        broke it in is answered on its own."""
        current = self._drop()
        if current is not None:
            await self._reject(
                ProtocolError(
                    ErrorCode.UNAVAILABLE,
                    f"update in parts discarded after {current.received} of "
                    f"{current.parts} parts: {why}; send it again from part 0",
                    doc=current.doc,
                    clock=current.clock,
                )
            )

    def close(self) -> None:
        """The connection closed: nobody is left to tell; the client resends
        the whole update after it reconnects."""
        current = self._drop()
        if current is not None:
            log.info(
                "connection closed with %d of %d parts of clock %d of %s: discarded",
                current.received,
                current.parts,
                current.clock,
                current.doc,
            )
