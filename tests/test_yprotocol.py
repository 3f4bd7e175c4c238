"""The y-protocols codec: the bytes stock clients send, round trips, and
hostile input refused with YProtocolError (never another exception)."""

from __future__ import annotations

import random

import pytest

from yrelay.yjs import yprotocol
from yrelay.yjs.yprotocol import (
    AuthMessage,
    AwarenessMessage,
    QueryAwarenessMessage,
    SyncMessage,
    SyncStep,
    YProtocolError,
)


def test_known_bytes_of_a_stock_client() -> None:
    # y-protocols writeSyncStep1 of an empty Y.Doc: messageSync, step 1, the state vector [0] (no clients)
    assert yprotocol.decode(bytes([0, 0, 1, 0])) == SyncMessage(SyncStep.STEP1, b"\x00")
    assert yprotocol.sync_step1(b"\x00") == bytes([0, 0, 1, 0])
    # an empty update (no structs, no deletes) as step 2
    assert yprotocol.sync_step2(b"\x00\x00") == bytes([0, 1, 2, 0, 0])
    assert yprotocol.sync_update(b"\x00\x00") == bytes([0, 2, 2, 0, 0])
    assert yprotocol.query_awareness() == b"\x03"
    assert yprotocol.permission_denied("no") == bytes([2, 0, 2]) + b"no"


@pytest.mark.parametrize(
    "message",
    [
        SyncMessage(SyncStep.STEP1, b"\x01\x05\x03"),
        SyncMessage(SyncStep.STEP2, bytes(300)),
        SyncMessage(SyncStep.UPDATE, b"\x00\x00"),
        AwarenessMessage(b"\x01\x07\x01\x02{}"),
        AuthMessage("read-only: this token may not change this document"),
        AuthMessage("é ☃"),
        QueryAwarenessMessage(),
    ],
)
def test_round_trip(message: yprotocol.Message) -> None:
    assert yprotocol.decode(yprotocol.encode(message)) == message


@pytest.mark.parametrize(
    "data, why",
    [
        (b"", "ends"),
        (b"\x80", "ends inside a number"),  # truncated varint
        (b"\xff" * 9, "number"),  # varint too long
        (b"\x07", "unknown message type 7"),
        (b"\x00\x03\x00", "unknown sync step 3"),
        (b"\x00\x00", "ends"),  # step 1 without its payload
        (b"\x00\x01\x05ab", "ends inside a sync payload"),
        (b"\x00\x02\xff\xff\xff\xff\x0f", "ends inside a sync payload"),  # a huge length
        (b"\x01\xff\xff\xff\xff\xff\xff\xff\x7f", "number"),  # a length past 2^53
        (b"\x02\x01\x00", "unknown auth message 1"),
        (b"\x02\x00\x02\xff\xfe", "not UTF-8"),
        (b"\x00\x00\x01\x00\x00", "1 bytes after the message"),
        (b"\x03\x00", "after the message"),
    ],
)
def test_hostile_input_is_a_clean_error(data: bytes, why: str) -> None:
    with pytest.raises(YProtocolError, match=why):
        yprotocol.decode(data)


def test_random_bytes_never_raise_anything_else() -> None:
    rng = random.Random(19)
    seeds = [
        yprotocol.encode(m)
        for m in (
            SyncMessage(SyncStep.STEP1, b"\x01\x05\x03"),
            AuthMessage("x"),
            AwarenessMessage(b"\x01\x07\x01\x02{}"),
        )
    ]
    for _ in range(20_000):
        if rng.random() < 0.5:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(12)))
        else:
            data = bytearray(rng.choice(seeds))
            data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data[: rng.randrange(len(data) + 1)])
        try:
            yprotocol.decode(data)
        except YProtocolError:
            pass
