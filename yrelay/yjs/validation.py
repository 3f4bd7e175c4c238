"""The validator worker process: checks batches of Yjs updates with
:func:`yrelay.yjs.crdt.validate_update`, off the server's event loop.

The engines are Rust extensions that hold the GIL while they decode, so a
thread cannot bound an update that makes one spin or explode (y-py aborts
its process on some); a process can be killed. The server
(:mod:`yrelay.yjs.validator`) talks to ``python -m yrelay.yjs.validation``
(``--ypy``: y-py's check too, the ``validate_with_ypy`` setting) over its
stdin/stdout:

- request: ``u32 count``, then per update ``u32 length`` + bytes;
- reply: per update ``u16 length`` + a UTF-8 reason, empty = valid.

All integers are big-endian. The worker exits when its stdin closes.
"""

from __future__ import annotations

import struct
import sys
from typing import BinaryIO

from yrelay.yjs import crdt
from yrelay.yjs.engine import WITH_YPY_FLAG, announce_ready, read_exact

_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")


def encode_request(updates: list[bytes]) -> bytes:
    return _U32.pack(len(updates)) + b"".join(_U32.pack(len(update)) + update for update in updates)


def check(update: bytes, with_ypy: bool = False) -> str:
    """'' when ``update`` is valid, else why not (at most 200 characters).
    Valid means yrelay's layout decoder (GC) and pycrdt (the server's sync
    answers and folds, :mod:`yrelay.yjs.engine`, and the Python client) read it;
    ``with_ypy``: y-py too (deployments with y-py clients)."""
    try:
        crdt.validate_update(update, with_ypy)
    except crdt.InvalidUpdate as exc:
        return str(exc)[:200] or "invalid update"
    return ""


def serve(stdin: BinaryIO, stdout: BinaryIO, with_ypy: bool = False) -> None:
    if with_ypy:
        crdt.check_engine(crdt.YPY)  # imported before the server's deadlines start
    announce_ready(stdout)
    while True:
        header = read_exact(stdin, 4)
        if header is None:
            return
        reasons = []
        for _ in range(_U32.unpack(header)[0]):
            length = read_exact(stdin, 4)
            update = read_exact(stdin, _U32.unpack(length)[0]) if length is not None else None
            if update is None:
                return
            reasons.append(check(update, with_ypy).encode()[:400])
        stdout.write(b"".join(_U16.pack(len(reason)) + reason for reason in reasons))
        stdout.flush()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer, with_ypy=WITH_YPY_FLAG in sys.argv[1:])
