"""Realistic Yjs traffic, made before the clock starts: one y-py document per
writer types words and corrects itself, and every transaction's update is
kept, in order.

Every update carries an inserted struct (a correction is one transaction that
deletes one to three characters and types one), so each one is named by the
``(client, clock)`` of its first struct, which survives a server decoding and
re-encoding it (pycrdt-websocket and y-websocket broadcast their own encoding
of what they applied, not the bytes received).
"""

from __future__ import annotations

import random

from yrelay import crdt
from yrelay.awareness import _varuint

WORDS = ("the ", "quick ", "brown ", "fox ", "jumps ", "over ", "a ", "lazy ", "dog ", "and ", "then ", "naps ")
#: Share of updates that are corrections (a delete and a one-character insert).
CORRECTIONS = 0.2


def writer_edits(client_id: int, count: int, seed: int = 0) -> list[bytes]:
    """``count`` updates of one writer typing into the root text ``text``."""
    doc = crdt.new_doc(client_id)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    rng = random.Random(seed or client_id)
    cursor = 0
    while len(updates) < count:
        if cursor > 4 and rng.random() < CORRECTIONS:
            length = rng.randint(1, 3)
            crdt.replace_text(doc, cursor - length, length, rng.choice("aeiou"))
            cursor += 1 - length
        else:
            word = rng.choice(WORDS)
            crdt.insert_text(doc, cursor, word)
            cursor += len(word)
    return updates


def read_uint(data: bytes, pos: int) -> tuple[int, int]:
    """A lib0 varuint at ``pos``: (value, position after it)."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


#: A lib0 varuint (the codec presence already has).
write_uint = _varuint


def update_key(update: bytes) -> int | None:
    """``client << 32 | clock`` of the update's first struct; None without structs."""
    groups, pos = read_uint(update, 0)
    if not groups:
        return None
    _, pos = read_uint(update, pos)  # structs in the group
    client, pos = read_uint(update, pos)
    clock, _ = read_uint(update, pos)
    return client << 32 | clock


def key_client(key: int) -> int:
    return key >> 32
