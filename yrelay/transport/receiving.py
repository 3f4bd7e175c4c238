"""Bytes of websocket messages being received, across a whole process.

A frame header may declare up to the message size limit before a single
byte of its payload arrives, and the websocket library keeps what did
arrive until the frame is whole. Per connection, the limit before
authentication is small (``preauth_max_frame_bytes``); this bounds all
connections together (``max_receiving_bytes``): partial frames, fragments
of a message and reads not parsed yet. When a read takes the process past
the bound, the connection holding the most is closed (1013, try again
later): a wave of half-sent frames costs at most the bound, never the sum
of every socket's message limit (issue 30: 24 sockets holding 8 MiB each
pinned ~193 MiB), and one client holding most of the bound cannot make
everybody else's large messages fail.

One per process (:data:`RECEIVING`): the uvicorn protocol of every socket
(:mod:`.ws_protocol`) books into it; ``/metrics`` reads it.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["RECEIVING", "Holder", "Receiving"]


class Holder(Protocol):
    """A connection that holds bytes being received and can be made to let go."""

    def refuse_receiving(self) -> None:
        """Close the connection (1013) and book nothing any more."""


class Receiving:
    """The process's bytes being received, by connection, and how often
    the bound closed one."""

    __slots__ = ("held", "closed", "_holders")

    def __init__(self) -> None:
        self.held = 0
        self.closed = 0
        self._holders: dict[Holder, int] = {}

    def book(self, holder: Holder, held: int) -> None:
        """``holder`` now holds ``held`` bytes."""
        self.held += held - self._holders.pop(holder, 0)
        if held:
            self._holders[holder] = held

    def enforce(self, limit: int) -> None:
        """Past ``limit`` (0: none), close the largest holders until within."""
        while limit > 0 and self.held > limit and self._holders:
            largest = max(self._holders, key=self._holders.__getitem__)
            self.closed += 1
            largest.refuse_receiving()
            self.book(largest, 0)  # whatever it did, it holds nothing now


#: The process's accounting.
RECEIVING = Receiving()
