"""Where client frames end in a websocket byte stream, without parsing them.

The websocket library parses every frame of whatever bytes it is given, at
once. To parse a socket read a few frames at a time (one read may hold
thousands of tiny frames: issue 30), the protocol (:mod:`.ws_protocol`)
must know where frames end before it hands bytes over: this reads frame
headers (RFC 6455 5.2: two bytes, an extended length of 2 or 8, a 4-byte
mask key) and skips payloads, a few microseconds per frame, and a large
frame's payload is handed over whole.
"""

from __future__ import annotations

__all__ = ["FrameWalker"]

#: The opcode of a close frame.
CLOSE = 0x8


class FrameWalker:
    """The frame boundaries of one direction of one connection."""

    __slots__ = ("_need", "_head", "close_seen")

    def __init__(self) -> None:
        #: Payload bytes of the current frame not walked yet.
        self._need = 0
        #: Header bytes of the next frame, when a read ended inside them
        #: (made then: an idle connection's memory counts).
        self._head: bytearray | None = None
        #: A close frame's header was walked.
        self.close_seen = False

    def walk(self, data: bytes, start: int, frames: int) -> tuple[int, int]:
        """From ``data[start]``: the offset just after at most ``frames``
        frames end (or the end of ``data``), and how many ended there."""
        position, size, ended = start, len(data), 0
        while position < size and ended < frames:
            if self._need:
                taken = min(self._need, size - position)
                position += taken
                self._need -= taken
                ended += self._need == 0
                continue
            if self._head is None and size - position >= 2:
                header = _header(data, position)
                if header is not None:  # the whole header is here: the usual case
                    self.close_seen |= data[position] & 0x0F == CLOSE
                    position += header[0]
                    self._need = header[1]
                    ended += self._need == 0
                    continue
            if self._head is None:
                self._head = bytearray()
            self._head.append(data[position])  # a header split between reads: a byte at a time
            position += 1
            header = _header(self._head, 0)
            if header is not None:
                self.close_seen |= self._head[0] & 0x0F == CLOSE
                self._head = None
                self._need = header[1]
                ended += self._need == 0
        return position, ended


def _header(data: bytes | bytearray, start: int) -> tuple[int, int] | None:
    """``(header length, payload length)`` of the frame at ``start``, or
    None while ``data`` ends inside its header."""
    available = len(data) - start
    if available < 2:
        return None
    second = data[start + 1]
    length, extended = second & 0x7F, 0
    if length == 126:
        extended = 2
    elif length == 127:
        extended = 8
    size = 2 + extended + (4 if second & 0x80 else 0)
    if available < size:
        return None
    if extended:
        length = int.from_bytes(data[start + 2 : start + 2 + extended], "big")
    return size, length
