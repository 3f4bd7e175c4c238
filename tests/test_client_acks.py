"""The Python client coalesces its cumulative acks: one per document per
ACK_INTERVAL, carrying the newest offset, sent on the connection the
deliveries came on."""

from __future__ import annotations

import asyncio
from typing import Any

from conftest import eventually
from yrelay.client import client as client_module
from yrelay.storage.offsets import StreamId
from yrelay.yjs import crdt


async def test_deliveries_in_one_interval_share_one_ack_with_the_newest_offset(server_url, make_client, redis_client):
    writer, reader = await make_client(server_url), await make_client(server_url)
    await writer.subscribe("acks")
    doc = await reader.subscribe("acks")
    sent: list[dict[str, Any]] = []
    send = reader._send_quietly

    async def recording(frame: dict[str, Any]) -> None:
        sent.append(frame)
        await send(frame)

    reader._send_quietly = recording  # type: ignore[method-assign]
    for i in range(20):  # twenty deliveries within one interval
        doc.offset = f"{1_700_000_000_000 + i}-0"
        reader._ack(doc)
    await asyncio.sleep(client_module.ACK_INTERVAL * 4)
    assert [frame["offset"] for frame in sent if frame["op"] == "ack"] == ["1700000000019-0"]

    sent.clear()  # and over the wire: what a reader acks reaches the tracker
    crdt.insert_text(writer.docs["acks"].ydoc, 0, "hello")
    await eventually(lambda: doc.text == "hello")
    await eventually(lambda: any(frame["op"] == "ack" for frame in sent))
    tracked = await redis_client.zscore("yrelay:{acks}:tracker", reader.session)
    assert tracked is not None and StreamId.from_score(tracked) >= StreamId.parse(sent[-1]["offset"])


async def test_an_ack_due_after_the_document_was_left_is_not_sent(server_url, make_client):
    reader = await make_client(server_url)
    doc = await reader.subscribe("left")
    sent: list[dict[str, Any]] = []
    reader._send_quietly = lambda frame: sent.append(frame) or asyncio.sleep(0)  # type: ignore[method-assign]
    doc.offset = "1700000000000-0"
    reader._ack(doc)
    del reader.docs["left"]  # as unsubscribe does: an ack would be answered not_subscribed
    await asyncio.sleep(client_module.ACK_INTERVAL * 4)
    assert sent == []
