"""The server reassembles an update sent in parts (feature ``update_parts``)
and refuses every broken sequence with an error naming doc and clock,
storing nothing and serving on (raw frames: every frame is the test's)."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from conftest import running_server
from wsraw import RawPeer
from yrelay.app.core.update_parts import PartsBudget, UpdateParts
from yrelay.protocol import ErrorCode, ProtocolError, Update, parse_client_frame
from yrelay.storage.keys import stream_key
from yrelay.yjs import crdt

#: Small limits so that a few kilobytes need parts.
LIMITS = {"max_frame_bytes": 4_096, "max_update_bytes": 20_000}
SLICE = 2_400  # bytes per part: 3,200 characters of base64, below the frame limit


def big_update(size: int, client_id: int = 7) -> bytes:
    doc = crdt.new_doc(client_id)
    crdt.insert_text(doc, 0, "".join(chr(97 + (i * 7919) % 26) for i in range(size)))
    return crdt.encode_state(doc)


def part_frames(doc: str, clock: int, update: bytes, size: int = SLICE) -> list[dict]:
    slices = [update[i : i + size] for i in range(0, len(update), size)]
    return [
        {
            "op": "update",
            "doc": doc,
            "clock": clock,
            "update": base64.b64encode(piece).decode(),
            "part": index,
            "parts": len(slices),
        }
        for index, piece in enumerate(slices)
    ]


async def subscribed_peer(url: str, *docs: str) -> RawPeer:
    peer = await RawPeer.connect(url)
    for doc in docs:
        await peer.send({"op": "subscribe", "doc": doc})
        await peer.expect("subscribed")
        await peer.expect("synced")
    return peer


async def answer(peer: RawPeer, op: str | None = None) -> dict:
    """The next frame that is not a delivery."""
    while True:
        frame = await peer.recv()
        if frame["op"] != "deliver" and (op is None or frame["op"] == op):
            return frame


async def still_works(peer: RawPeer, redis_client, doc: str = "p") -> None:
    """A small update on the same connection is stored and acked."""
    before = await redis_client.xlen(stream_key(doc))
    reply = await peer.update(doc, 999, big_update(10, client_id=99))
    assert reply["op"] == "appended" and reply["clock"] == 999, reply
    assert await redis_client.xlen(stream_key(doc)) == before + 1


async def test_an_update_in_parts_is_stored_as_one_entry_and_delivered_whole(redis_url, redis_client):
    update = big_update(12_000)
    async with running_server(redis_url, **LIMITS) as url:
        writer, reader = await subscribed_peer(url, "p", "q"), await subscribed_peer(url, "p")
        frames = part_frames("p", 1, update)
        assert len(frames) >= 5
        for index, frame in enumerate(frames):
            await writer.send(frame)
            if index == 2:  # a plain update of another document may come between parts
                await writer.send(
                    {"op": "update", "doc": "q", "clock": 2, "update": base64.b64encode(big_update(5, 3)).decode()}
                )
        acks = {(await answer(writer))["clock"] for _ in range(2)}
        assert acks == {1, 2}
        assert await redis_client.xlen(stream_key("p")) == 1
        delivered = await reader.expect("deliver")
        received = crdt.new_doc()
        crdt.apply_update(received, base64.b64decode(delivered["entries"][0]["update"]))
        source = crdt.new_doc()
        crdt.apply_update(source, update)
        assert crdt.text_of(received) == crdt.text_of(source) and len(crdt.text_of(received)) == 12_000


async def test_parts_out_of_order_are_refused_naming_doc_and_clock(redis_url, redis_client):
    async with running_server(redis_url, **LIMITS) as url:
        peer = await subscribed_peer(url, "p")
        frames = part_frames("p", 5, big_update(12_000))
        await peer.send(frames[0])
        await peer.send(frames[2])  # part 1 skipped
        error = await answer(peer)
        assert (error["op"], error["code"], error["doc"], error["clock"]) == ("error", "malformed_frame", "p", 5)
        await peer.send(frames[3])  # the rest of the broken sequence: the client was told, no more errors
        await peer.nothing(0.3)
        assert await redis_client.xlen(stream_key("p")) == 0
        await still_works(peer, redis_client)


async def test_a_clock_changed_mid_way_discards_the_open_update(redis_url, redis_client):
    async with running_server(redis_url, **LIMITS) as url:
        peer = await subscribed_peer(url, "p")
        first, second = part_frames("p", 5, big_update(12_000)), part_frames("p", 6, big_update(12_000, 8))
        await peer.send(first[0])
        await peer.send(first[1])
        await peer.send(second[2])  # another clock, mid-way
        errors = [await answer(peer), await answer(peer)]
        assert {(e["code"], e["doc"], e["clock"]) for e in errors} == {
            ("unavailable", "p", 5),
            ("malformed_frame", "p", 6),
        }
        assert "discarded" in errors[0]["message"]
        await peer.send(first[2])  # the discarded update's next part: it must start again
        assert (await answer(peer))["clock"] == 5
        assert await redis_client.xlen(stream_key("p")) == 0
        await still_works(peer, redis_client)
        for frame in first:  # sent again from part 0, it is stored
            await peer.send(frame)
        assert (await answer(peer, "appended"))["clock"] == 5


async def test_parts_over_the_update_limit_are_refused_before_they_are_kept(redis_url, redis_client):
    async with running_server(redis_url, **LIMITS) as url:
        peer = await subscribed_peer(url, "p")
        frames = part_frames("p", 9, big_update(30_000))
        for frame in frames:
            await peer.send(frame)
        error = await answer(peer)
        assert (error["code"], error["doc"], error["clock"]) == ("update_too_large", "p", 9)
        await peer.nothing(0.3)  # one error: the parts after it are ignored
        assert await redis_client.xlen(stream_key("p")) == 0
        await still_works(peer, redis_client)


async def test_a_part_refused_before_it_is_kept_ends_its_update(redis_url, redis_client):
    """A part refused before the parts see it (its base64 is broken: the
    connection refuses it before reassembly; rates no longer refuse, they
    wait): the rest of that attempt is ignored, the update is sent again
    from part 0 and stored."""
    async with running_server(redis_url, **LIMITS) as url:
        peer = await subscribed_peer(url, "p")
        frames = part_frames("p", 4, big_update(12_000))
        broken = [*frames[:1], {**frames[1], "update": "***"}, *frames[2:]]
        for frame in broken:
            await peer.send(frame)
        error = await answer(peer)
        assert (error["code"], error["doc"], error["clock"]) == ("malformed_frame", "p", 4)
        await peer.nothing(0.3)
        assert await redis_client.xlen(stream_key("p")) == 0
        for frame in frames:
            await peer.send(frame)
        assert (await answer(peer))["op"] == "appended"
        assert await redis_client.xlen(stream_key("p")) == 1


async def test_a_part_frame_with_bad_numbers_is_refused(redis_url, redis_client):
    async with running_server(redis_url, **LIMITS) as url:
        peer = await subscribed_peer(url, "p")
        frame = part_frames("p", 4, big_update(12_000))[0]
        for clock, bad in enumerate(
            ({**frame, "part": 5, "parts": 5}, {**frame, "parts": None}, {**frame, "part": None})
        ):
            await peer.send({**bad, "clock": 4 + clock})
            error = await answer(peer)
            assert (error["code"], error["doc"], error["clock"]) == ("malformed_frame", "p", 4 + clock)
        assert await redis_client.xlen(stream_key("p")) == 0
        await still_works(peer, redis_client)


async def test_a_connection_closed_mid_way_stores_nothing(redis_url, redis_client):
    async with running_server(redis_url, **LIMITS) as url:
        peer = await subscribed_peer(url, "p")
        frames = part_frames("p", 3, big_update(12_000))
        for frame in frames[:-1]:
            await peer.send(frame)
        await peer.close()
        await asyncio.sleep(0.2)
        peer = await subscribed_peer(url, "p")
        await peer.send(frames[-1])  # the last part on a new connection: no update is open there
        assert (await answer(peer))["code"] == "malformed_frame"
        assert await redis_client.xlen(stream_key("p")) == 0


async def test_frame_too_large_names_the_update(redis_url, redis_client):
    async with running_server(redis_url, **LIMITS) as url:
        peer = await subscribed_peer(url, "p")
        await peer.send(
            json.dumps(
                {"op": "update", "doc": "p", "clock": 12, "update": base64.b64encode(big_update(6_000)).decode()}
            )
        )
        error = await answer(peer)
        assert (error["code"], error["doc"], error["clock"]) == ("frame_too_large", "p", 12)
        await peer.send("x" * 5_000)  # not JSON: refused all the same, without a name
        error = await answer(peer)
        assert error["code"] == "frame_too_large" and "doc" not in error
        await still_works(peer, redis_client)


async def test_all_connections_together_hold_at_most_the_process_budget():
    """Many connections that open large updates and never finish cannot
    exhaust memory: past the process's budget a part is refused with
    unavailable (resend later); bytes come back when a sequence ends."""
    budget = PartsBudget(7 * SLICE)
    rejected: list[ProtocolError] = []

    async def reject(error: ProtocolError) -> None:
        rejected.append(error)

    first, second = UpdateParts(LIMITS["max_update_bytes"], reject, budget), UpdateParts(20_000, reject, budget)
    frames = [parse_client_frame(json.dumps(frame)) for frame in part_frames("p", 1, big_update(12_000))]
    others = [parse_client_frame(json.dumps(frame)) for frame in part_frames("q", 2, big_update(12_000, 8))]
    assert all(isinstance(frame, Update) for frame in frames + others)
    for frame in frames[:5]:
        assert await first.feed(frame, base64.b64decode(frame.update)) is None
    for frame in others[:2]:
        assert await second.feed(frame, base64.b64decode(frame.update)) is None
    with pytest.raises(ProtocolError) as refused:
        await second.feed(others[2], base64.b64decode(others[2].update))
    assert (refused.value.code, refused.value.doc, refused.value.clock) == (ErrorCode.UNAVAILABLE, "q", 2)
    assert budget.held == 5 * SLICE  # the refused update's parts went back
    first.close()
    assert budget.held == 0
    for frame in others:  # sent again from part 0, it fits now
        whole = await second.feed(frame, base64.b64decode(frame.update))
    assert whole == big_update(12_000, 8) and budget.held == 0 and not rejected
