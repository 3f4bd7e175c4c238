"""What an idle connection costs the server (issue 20): no task of its own
(one timer wheel per process), no deflate context unless compression is
chosen, and the lean event and queue behaving as asyncio's."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from conftest import running_server
from yrelay import logs
from yrelay.app.lean import Flag, Inbox
from yrelay.app.ticker import SLOTS, Ticker
from yrelay_tools.bench.wsclient import WsClient


class Peer:
    """A raw client (no tasks of its own) that keeps the frames it got."""

    def __init__(self) -> None:
        self.frames: asyncio.Queue[dict] = asyncio.Queue()
        self.ws: WsClient | None = None

    async def open(self, url: str, deflate: bool = True) -> "Peer":
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        self.ws = await WsClient.connect("127.0.0.1", port, "/ws",
                                         lambda _, data: self.frames.put_nowait(json.loads(data)), deflate=deflate)
        return self

    async def expect(self, op: str) -> dict:
        while True:
            frame = await asyncio.wait_for(self.frames.get(), 10)
            if frame["op"] == op:
                return frame

    async def hello(self) -> dict:
        assert self.ws is not None
        self.ws.send_text(json.dumps({"op": "hello", "protocol": 1}))
        return await self.expect("welcome")


async def test_an_idle_connection_has_no_task_but_its_asgi_call(redis_url: str) -> None:
    """Each connection used to keep a timer task asleep (hello deadline,
    resends, token expiry), and each subscription a pump waiting for work;
    one wheel per process does the first now, and a pump runs only while
    there is work."""
    async with running_server(redis_url, insecure_no_auth=True) as url:
        warm = await Peer().open(url)
        await warm.hello()
        await asyncio.sleep(0.3)  # the wheel is turning
        before = len(asyncio.all_tasks())
        peers = [await Peer().open(url) for _ in range(20)]
        for i, peer in enumerate(peers):
            await peer.hello()
            assert peer.ws is not None
            peer.ws.send_text(json.dumps({"op": "subscribe", "doc": f"quiet-{i % 3}"}))
            await peer.expect("subscribed")
        await asyncio.sleep(0.3)
        tasks = asyncio.all_tasks()
        assert not [task for task in tasks if task.get_name().startswith("yrelay-sub-")]  # no pump waits
        # uvicorn's one task per socket, give or take the server's own coming and going
        # (before: 3 per socket, the ASGI call, a timer and a pump)
        assert len(tasks) - before < 30
        for peer in [warm, *peers]:
            assert peer.ws is not None
            peer.ws.close()


async def test_a_subscription_without_a_waiting_pump_still_delivers_and_resends(redis_url: str) -> None:
    """The pump starts when there is work (a delivery, an ack, a resend due)
    and ends when there is none; an unacked entry is still sent again."""
    async with running_server(redis_url, insecure_no_auth=True) as url:
        reader, writer = await Peer().open(url), await Peer().open(url)
        for peer in (reader, writer):
            await peer.hello()
            assert peer.ws is not None
            peer.ws.send_text(json.dumps({"op": "subscribe", "doc": "woken"}))
            await peer.expect("subscribed")
        assert writer.ws is not None and reader.ws is not None
        writer.ws.send_text(json.dumps({"op": "update", "doc": "woken", "clock": 1,
                                        "update": "AQEBAAQBBHRleHQEbWluZQA="}))
        first = await reader.expect("deliver")
        again = await reader.expect("deliver")  # not acked: resent after resend_after (0.5 s)
        assert again["entries"] == first["entries"]
        reader.ws.send_text(json.dumps({"op": "ack", "doc": "woken", "offset": first["entries"][-1]["id"]}))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reader.expect("deliver"), 1.0)
        reader.ws.close()
        writer.ws.close()


async def test_the_hello_deadline_still_cuts_a_silent_connection_off(redis_url: str) -> None:
    async with running_server(redis_url, insecure_no_auth=True, hello_timeout=0.3) as url:
        peer = await Peer().open(url)
        error = await peer.expect("error")
        assert error["code"] == "handshake_required"
        assert peer.ws is not None
        await asyncio.wait_for(peer.ws.closed, 5)


async def test_compression_is_not_negotiated_by_default(redis_url: str) -> None:
    """A browser's offer (permessage-deflate; client_max_window_bits) is declined:
    a deflate context per connection was half of an idle connection's memory."""
    async with running_server(redis_url, insecure_no_auth=True) as url:
        peer = await Peer().open(url, deflate=True)
        assert peer.ws is not None and peer.ws.deflate is None
        assert (await peer.hello())["op"] == "welcome"
        peer.ws.close()


async def test_compression_when_chosen_keeps_no_context_between_messages(redis_url: str) -> None:
    async with running_server(redis_url, insecure_no_auth=True, ws_compression=True) as url:
        peer = await Peer().open(url, deflate=True)
        deflate = peer.ws.deflate if peer.ws else None
        assert deflate is not None  # negotiated, and both sides start every message afresh
        assert deflate.server_reset and deflate.client_reset
        assert deflate.server_bits == deflate.client_bits == 12
        assert (await peer.hello())["op"] == "welcome"  # compressed both ways (the client deflates what it sends)
        assert peer.ws is not None
        peer.ws.send_text(json.dumps({"op": "subscribe", "doc": "squeezed"}))
        assert (await peer.expect("subscribed"))["doc"] == "squeezed"
        peer.ws.close()


async def test_the_ticker_calls_each_callback_once_per_interval_until_removed() -> None:
    ticker = Ticker(0.05)
    calls: list[str] = []
    remove_a = ticker.add(lambda: calls.append("a"))
    ticker.add(lambda: calls.append("b"))
    await asyncio.sleep(0.05 * 4 + 0.05 / SLOTS)
    assert 3 <= calls.count("a") <= 5 and 3 <= calls.count("b") <= 5
    remove_a()
    seen = calls.count("a")
    await asyncio.sleep(0.15)
    assert calls.count("a") == seen and calls.count("b") >= 5
    ticker.close()


async def test_a_failing_callback_is_logged_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    ticker = Ticker(0.02)
    calls: list[int] = []

    def fails() -> None:
        raise RuntimeError("boom")

    ticker.add(fails)
    ticker.add(lambda: calls.append(1))
    with caplog.at_level(logging.ERROR):
        await asyncio.sleep(0.1)
    assert len(calls) >= 2 and "periodic connection check failed" in caplog.text
    ticker.close()


async def test_a_callback_runs_in_its_connections_context_and_the_wheel_stops_when_empty() -> None:
    ticker = Ticker(0.02)
    seen: list[str | None] = []
    logs.session.set("s-1")
    remove = ticker.add(lambda: seen.append(logs.session.get()))
    logs.session.set(None)
    await asyncio.sleep(0.05)
    assert seen and set(seen) == {"s-1"}
    remove()
    await asyncio.sleep(0.05)
    assert ticker._task is None  # nothing registered: no task left turning


async def test_flag_wakes_every_waiter_and_inbox_is_fifo() -> None:
    flag = Flag()
    waiters = [asyncio.create_task(flag.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    flag.set()
    assert await asyncio.gather(*waiters) == [True, True, True]
    flag.clear()
    assert not flag.is_set()
    inbox: Inbox[int] = Inbox()
    getter = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    inbox.put_nowait(1)
    inbox.put_nowait(2)
    assert await getter == 1 and await inbox.get() == 2 and inbox.empty()


async def test_an_inbox_getter_cancelled_after_its_wake_passes_the_item_on() -> None:
    inbox: Inbox[str] = Inbox()
    first, second = asyncio.create_task(inbox.get()), asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    inbox.put_nowait("x")  # wakes the first ...
    first.cancel()  # ... which is cancelled before it runs
    assert await asyncio.wait_for(second, 1) == "x"


def test_uvicorn_options_carry_the_compression_choice_and_refuse_an_unknown_implementation() -> None:
    from yrelay.app.ws_protocol import YrelayWebSocketProtocol
    from yrelay.config import Settings

    options = Settings().uvicorn_options()
    assert options["ws_per_message_deflate"] is False and options["ws"] is YrelayWebSocketProtocol
    assert Settings(ws_compression=True).uvicorn_options()["ws_per_message_deflate"] is True
    assert Settings(ws_implementation="wsproto").uvicorn_options()["ws"] == "wsproto"
    with pytest.raises(ValueError, match="ws_implementation"):
        Settings(ws_implementation="granian")
