"""Large pastes from the Python client (issue 15): an update larger than a
frame goes in parts and arrives whole; one over ``max_update_bytes`` is
refused locally with an error naming doc and size, and the socket keeps
syncing every other document."""

from __future__ import annotations

import asyncio
import time

from conftest import eventually, running_server
from yrelay.storage.keys import stream_key
from yrelay.yjs import crdt

MB = 1024 * 1024


def paste(size: int) -> str:
    """Text that does not shrink: every line differs."""
    line = "".join(chr(97 + i % 26) for i in range(63)) + "\n"
    return "".join(f"{n:08d}{line}" for n in range(size // (len(line) + 8) + 1))[:size]


async def test_a_5mb_paste_arrives_whole_at_another_client(redis_url, redis_client, make_client):
    text = paste(5 * MB)
    async with running_server(redis_url) as url:
        writer, reader = await make_client(url), await make_client(url)
        wdoc, rdoc = await writer.subscribe("big"), await reader.subscribe("big")
        assert "update_parts" in writer.features
        sent: list[dict] = []
        original = writer._send_parts

        async def spy(item, frames):
            sent.extend(frames)
            await original(item, frames)

        writer._send_parts = spy  # type: ignore[method-assign]
        crdt.insert_text(wdoc.ydoc, 0, text)
        await writer.wait_idle(60)
        assert len(sent) >= 4 and all(
            len(crdt_frame["update"]) < writer.limits["max_frame_bytes"] for crdt_frame in sent
        )
        await eventually(lambda: len(rdoc.text) == len(text), timeout=60)
        assert rdoc.text == text
        assert await redis_client.xlen(stream_key("big")) == 1  # one entry, reassembled by the server
        assert not writer.errors


async def test_a_20mb_paste_is_refused_locally_and_other_documents_keep_syncing(redis_url, make_client):
    events: list[tuple[str, dict]] = []
    async with running_server(redis_url) as url:
        writer = await make_client(url, on_event=lambda name, data: events.append((name, data)))
        reader = await make_client(url)
        huge, small = await writer.subscribe("huge"), await writer.subscribe("small")
        rsmall = await reader.subscribe("small")
        crdt.insert_text(huge.ydoc, 0, paste(20 * MB))
        await eventually(lambda: any(name == "error" for name, _ in events), timeout=30)
        [error] = [data for name, data in events if name == "error"]
        assert error["code"] == "update_too_large" and error["doc"] == "huge"
        assert error["size"] > 20 * MB and error["limit"] == writer.limits["max_update_bytes"]
        assert writer.pending == 0  # dropped from the buffer; the local document keeps the text
        assert len(huge.text) == 20 * MB
        started = time.monotonic()
        crdt.insert_text(small.ydoc, 0, "still here")
        await eventually(lambda: rsmall.text == "still here", timeout=5)
        assert time.monotonic() - started < 1.0  # the bound for the other document
        await asyncio.sleep(0.5)
        assert writer.connected.is_set() and [name for name, _ in events].count("disconnected") == 0


async def test_a_connection_lost_mid_parts_resends_the_update_whole(redis_url, redis_client, make_client):
    """The socket drops after a few parts: the server stores nothing of
    them; after the reconnect the client sends the update again from part 0,
    and it is stored once."""
    text = paste(60_000)
    async with running_server(redis_url, max_frame_bytes=4_096) as url:
        writer, reader = await make_client(url), await make_client(url)
        wdoc, rdoc = await writer.subscribe("cut"), await reader.subscribe("cut")
        ws, parts = writer._ws, []
        original = ws.send

        async def send_then_cut(message: str) -> None:
            if '"part":' in message:
                parts.append(message)
                if len(parts) == 4:
                    await ws.close(code=4000)
            await original(message)

        ws.send = send_then_cut
        crdt.insert_text(wdoc.ydoc, 0, text)
        await writer.wait_idle(20)
        assert len(parts) == 4 and writer._ws is not ws  # cut after the fourth, then reconnected
        await eventually(lambda: rdoc.text == text)
        assert await redis_client.xlen(stream_key("cut")) == 1
