"""lib0's binary encoding: the one codec for every varint on the wire.

Yjs updates and state vectors, y-protocols awareness updates and the
reconciliation messages all use lib0's encoding (``lib0/encoding.js`` and
``lib0/decoding.js``, the library Yjs writes with):

* varuint: 7 bits a byte, low groups first, the high bit set while more follow;
* varint (signed): the first byte carries a continue bit (0x80), the sign
  (0x40) and the low 6 bits, then varuint-style 7-bit groups (so ``-0`` is
  ``0x40``; Python has no negative zero, it decodes to 0);
* varuint8array: a varuint byte length, then the bytes;
* varstring: a varuint8array of UTF-8 (lone surrogates written as U+FFFD,
  as JavaScript's TextEncoder does).

Decoding trusts nothing: every read is bounds-checked and raises the error
class the caller names (``Reader(data, MalformedUpdate)``), so each caller
keeps its own error type and no IndexError or bare ValueError leaks. A
number takes at most 8 bytes and must be at most 2**53 - 1: JavaScript
numbers are exact only that far, so no lib0 encoder writes more, and
anything larger is hostile. lib0 itself accepts non-minimal encodings (a
zero written as ``80 00``), and so does this reader, within the 8 bytes
(noting that it read one: engines other than lib0 differ on them).
"""

from __future__ import annotations

#: The largest integer JavaScript (and so lib0) holds exactly.
MAX_SAFE_INTEGER = 2**53 - 1
#: Bytes a varuint of at most MAX_SAFE_INTEGER needs (53 bits / 7, rounded up).
MAX_VARINT_BYTES = 8


class DecodeError(ValueError):
    """Bytes that are not lib0 encoding (the default error of a :class:`Reader`)."""


def write_varuint(out: bytearray, value: int) -> None:
    """Append ``value`` (0 to 2**53 - 1) as a lib0 varuint."""
    if not 0 <= value <= MAX_SAFE_INTEGER:
        raise ValueError(f"{value} does not fit a lib0 varuint")
    while value > 0x7F:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)


def varuint(value: int) -> bytes:
    """``value`` as a lib0 varuint."""
    if 0 <= value <= 0x7F:
        return bytes((value,))
    out = bytearray()
    write_varuint(out, value)
    return bytes(out)


def write_varint(out: bytearray, value: int) -> None:
    """Append ``value`` (magnitude at most 2**53 - 1) as a lib0 signed varint."""
    magnitude = -value if value < 0 else value
    if magnitude > MAX_SAFE_INTEGER:
        raise ValueError(f"{value} does not fit a lib0 varint")
    out.append((0x80 if magnitude > 0x3F else 0) | (0x40 if value < 0 else 0) | (magnitude & 0x3F))
    magnitude >>= 6
    while magnitude:
        out.append((0x80 if magnitude > 0x7F else 0) | (magnitude & 0x7F))
        magnitude >>= 7


def write_varuint8array(out: bytearray, data: bytes) -> None:
    """Append ``data`` with its varuint length in front."""
    write_varuint(out, len(data))
    out += data


def write_varstring(out: bytearray, text: str) -> None:
    """Append ``text`` as lib0 writes a string: UTF-8 with its byte length."""
    write_varuint8array(out, utf8(text))


def utf8(text: str) -> bytes:
    """``text`` as TextEncoder encodes it (lone surrogates become U+FFFD)."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()


class Reader:
    """lib0 decoding over ``data`` from ``pos``; every failure raises ``error``.

    The varuint read is written for speed (it runs a few times per struct of
    every update the server admits): the one-byte case, by far the most
    common, costs one index and one comparison.
    """

    __slots__ = ("data", "pos", "error", "padded")

    def __init__(self, data: bytes, error: type[Exception] = DecodeError, pos: int = 0):
        self.data = data
        self.pos = pos
        self.error = error
        #: A number was written in more bytes than it needs (``80 00``).
        self.padded = False

    def done(self) -> bool:
        return self.pos >= len(self.data)

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def uint8(self) -> int:
        pos = self.pos
        try:
            value = self.data[pos]
        except IndexError:
            raise self.error("data ends too early") from None
        self.pos = pos + 1
        return value

    def varuint(self) -> int:
        data, pos = self.data, self.pos
        try:
            byte = data[pos]
        except IndexError:
            raise self.error("data ends inside a number") from None
        if byte < 0x80:
            self.pos = pos + 1
            return byte
        return self._long_varuint(byte & 0x7F, 7, pos + 1)

    def varint(self) -> int:
        byte = self.uint8()  # continue bit, sign bit, 6 bits
        magnitude = byte & 0x3F if byte < 0x80 else self._long_varuint(byte & 0x3F, 6, self.pos)
        return -magnitude if byte & 0x40 else magnitude

    def _long_varuint(self, value: int, shift: int, pos: int) -> int:
        """The rest of a number whose first byte said "more follows"."""
        data = self.data
        end = min(len(data), pos + MAX_VARINT_BYTES - 1)
        while pos < end:
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if value > MAX_SAFE_INTEGER:
                raise self.error("number larger than 2^53 - 1")
            if byte < 0x80:
                if not byte:
                    self.padded = True
                self.pos = pos
                return value
            shift += 7
        if pos >= len(data):
            raise self.error("data ends inside a number")
        raise self.error(f"number longer than {MAX_VARINT_BYTES} bytes")

    def uint8array(self, length: int, what: str = "byte string") -> bytes:
        """The next ``length`` bytes (``what`` names them in the error)."""
        pos = self.pos
        end = pos + length
        if end > len(self.data):
            raise self.error(f"data ends inside a {what}")
        self.pos = end
        return self.data[pos:end]

    def varuint8array(self, what: str = "byte string") -> bytes:
        return self.uint8array(self.varuint(), what)

    def varstring(self, what: str = "string") -> str:
        """A UTF-8 string; invalid UTF-8 raises ``error`` (TextDecoder would
        substitute U+FFFD: a server relaying it would then change the bytes)."""
        try:
            return self.varuint8array(what).decode()
        except UnicodeDecodeError:
            raise self.error(f"a {what} is not UTF-8") from None

    def skip_any(self, depth: int = 0, strict: bool = False) -> None:
        """Skip one value of lib0's ``writeAny`` (JSON-like, with binary and
        bigint), nested at most 100 deep; ``strict``: its strings and keys
        must be UTF-8 (lib0's ``readAny`` throws otherwise)."""
        if depth > 100:
            raise self.error("value nested too deeply")
        kind = self.uint8()
        if kind in (127, 126, 121, 120):  # undefined, null, false, true
            return
        if kind == 125:  # integer
            self.varint()
        elif kind == 124:  # float32
            self.uint8array(4)
        elif kind in (123, 122):  # float64, bigint64
            self.uint8array(8)
        elif kind == 119:  # string
            self.varstring("string in a value") if strict else self.varuint8array()
        elif kind == 116:  # Uint8Array
            self.varuint8array()
        elif kind == 118:  # object: count, then key and value pairs
            for _ in range(self.varuint()):
                self.varstring("key in a value") if strict else self.varuint8array()
                self.skip_any(depth + 1, strict)
        elif kind == 117:  # array
            for _ in range(self.varuint()):
                self.skip_any(depth + 1, strict)
        else:
            raise self.error(f"unknown value type {kind}")


__all__ = [
    "MAX_SAFE_INTEGER",
    "MAX_VARINT_BYTES",
    "DecodeError",
    "Reader",
    "utf8",
    "varuint",
    "write_varint",
    "write_varstring",
    "write_varuint",
    "write_varuint8array",
]
