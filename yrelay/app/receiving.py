"""Bytes of websocket messages being received, across a whole process.

A frame header may declare up to the message size limit before a single
byte of its payload arrives, and the websocket library keeps what did
arrive until the frame is whole. Per connection, the limit before
authentication is small (``preauth_max_frame_bytes``); this bounds all
connections together (``max_receiving_bytes``): partial frames, fragments
of a message and reads not parsed yet. A connection whose read takes the
process past the bound is closed (1013, try again later), so a wave of
half-sent frames costs at most the bound, never the sum of every socket's
message limit (issue 30: 24 sockets holding 8 MiB each pinned ~193 MiB).

One per process (:data:`RECEIVING`): the uvicorn protocol of every socket
(:mod:`.ws_protocol`) books into it; ``/metrics`` reads it.
"""

from __future__ import annotations

__all__ = ["RECEIVING", "Receiving"]


class Receiving:
    """The process's bytes being received, and how often the bound closed a socket."""

    __slots__ = ("held", "closed")

    def __init__(self) -> None:
        self.held = 0
        self.closed = 0

    def change(self, before: int, after: int, limit: int) -> bool:
        """One connection now holds ``after`` bytes instead of ``before``:
        True if the process stays within ``limit`` (0: none). A connection
        that only shrinks is always within."""
        self.held += after - before
        return limit <= 0 or after <= before or self.held <= limit


#: The process's accounting.
RECEIVING = Receiving()
