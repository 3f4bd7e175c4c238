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

from yrelay.yjs import crdt
from yrelay.yjs.lib0 import Reader, varuint

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
    reader = Reader(data, pos=pos)
    return reader.varuint(), reader.pos


#: A lib0 varuint.
write_uint = varuint


def update_key(update: bytes) -> int | None:
    """``client << 32 | clock`` of the update's first struct; None without structs."""
    reader = Reader(update)
    if not reader.varuint():  # client sections
        return None
    reader.varuint()  # structs in the section
    client = reader.varuint()
    return client << 32 | reader.varuint()


def key_client(key: int) -> int:
    return key >> 32
