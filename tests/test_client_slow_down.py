"""The Python client and slow-down closes (issue 30): a minimal websocket peer
(no yrelay server) welcomes it, says ``rate_limited`` without doc and clock,
and closes with 4429, as the server does past its hard bound. The client
reconnects no sooner than ``retry_after_ms`` (1 s without one), and repeated
4429s soon after the welcome back off exponentially instead of restarting at
the first step. Only lower bounds on the gaps (a noisy machine), except one
generous upper bound that tells a growing backoff from the first step."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from yrelay.client import Backoff, YrelayClient


@dataclass
class Peer:
    url: str = ""
    opened: list[float] = field(default_factory=list)
    closed: list[float] = field(default_factory=list)
    frames: list[dict[str, Any]] = field(default_factory=list)

    def gaps(self) -> list[float]:
        """Seconds from the close of connection i to the arrival of connection i + 1."""
        return [self.opened[i + 1] - closed for i, closed in enumerate(self.closed[: len(self.opened) - 1])]

    async def close(self, ws: ServerConnection, code: int) -> None:
        self.closed.append(time.monotonic())
        await ws.close(code, "too many messages" if code == 4429 else "bye")


Script = Callable[[Peer, ServerConnection, int], Awaitable[None]]


def welcome(index: int) -> dict[str, Any]:
    """The real server's welcome fields (docs/protocol.md)."""
    return {
        "op": "welcome",
        "session": "slow-down-session",
        "resumed": index > 0,
        "protocol": 1,
        "limits": {"max_frame_bytes": 1_572_864, "max_update_bytes": 16_777_216},
        "auth": {"mode": "disabled", "subject": None, "permission": "write"},
        "features": ["strict_types"],
    }


async def flooded(peer: Peer, ws: ServerConnection, retry_after_ms: int | None) -> None:
    """The server's 4429: an error without doc and clock, then the close."""
    if retry_after_ms is not None:
        await ws.send(
            json.dumps(
                {
                    "op": "error",
                    "code": "rate_limited",
                    "retry_after_ms": retry_after_ms,
                    "message": f"too many messages: slow down, reconnect no sooner than {retry_after_ms} ms",
                }
            )
        )
    await peer.close(ws, 4429)


async def run_peer(script: Script, connections: int, client: YrelayClient) -> Peer:
    """Serve until the client has made ``connections`` connections and holds the last one."""
    peer = Peer()

    async def handler(ws: ServerConnection) -> None:
        index = len(peer.opened)
        peer.opened.append(time.monotonic())
        with contextlib.suppress(ConnectionClosed):  # closed with 4429 / 4000: an error close
            async for message in ws:
                frame = json.loads(message)
                peer.frames.append(frame)
                if frame["op"] == "hello":
                    await ws.send(json.dumps(welcome(index)))
                    await script(peer, ws, index)

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        client.urls = [f"ws://127.0.0.1:{port}/ws"]
        await client.connect(timeout=10)
        try:
            deadline = time.monotonic() + 30
            while len(peer.opened) < connections or not client.connected.is_set():
                assert time.monotonic() < deadline, f"{len(peer.opened)} connections of {connections}"
                await asyncio.sleep(0.01)
        finally:
            await client.close()
    return peer


async def test_4429_waits_retry_after_ms_and_records_the_error_without_touching_the_buffer():
    events: list[tuple[str, dict[str, Any]]] = []
    client = YrelayClient(
        "ws://unused",
        backoff=Backoff(base=0.02, max_delay=0.02, jitter=0.0),
        subscription_check_interval=None,
        on_event=lambda name, data: events.append((name, data)),
    )
    pending = client.buffer.add("doc", b"\x00\x00")  # an unacked update: an error without a clock leaves it

    async def script(peer: Peer, ws: ServerConnection, index: int) -> None:
        if index < 2:  # 600 ms, then none (1 s by default); the third connection stays
            await flooded(peer, ws, 600 if index == 0 else None)

    peer = await run_peer(script, 3, client)
    first, second = peer.gaps()[:2]
    assert first >= 0.59, f"reconnected {first:.3f} s after a 4429 with retry_after_ms 600"
    assert second >= 0.99, f"reconnected {second:.3f} s after a 4429 without retry_after_ms"
    limited = [frame for frame in client.errors if frame["code"] == "rate_limited"]
    assert len(limited) == 1 and limited[0]["retry_after_ms"] == 600, client.errors
    assert [data["code"] for name, data in events if name == "error"] == ["rate_limited"]
    assert client.buffer.get(pending.clock) is pending
    assert sum(1 for frame in peer.frames if frame["op"] == "hello") == 3


async def test_repeated_4429s_soon_after_the_welcome_back_off_exponentially():
    closes, base = 5, 0.1
    client = YrelayClient(
        "ws://unused",
        backoff=Backoff(base=base, factor=2.0, max_delay=10.0, jitter=0.0),
        subscription_check_interval=None,
    )

    async def script(peer: Peer, ws: ServerConnection, index: int) -> None:
        if index < closes:
            await flooded(peer, ws, 30)

    peer = await run_peer(script, closes + 1, client)
    gaps = peer.gaps()
    assert len(gaps) == closes
    for attempt, gap in enumerate(gaps):  # the welcome did not reset it: each 100 ms before the fix
        assert gap >= base * 2**attempt - 0.01, f"gap {attempt}: {gap:.3f} s (all: {gaps})"


async def test_ordinary_closes_after_a_welcome_still_reconnect_at_the_first_step():
    closes = 5
    client = YrelayClient(
        "ws://unused",
        backoff=Backoff(base=0.1, factor=2.0, max_delay=10.0, jitter=0.0),
        subscription_check_interval=None,
    )

    async def script(peer: Peer, ws: ServerConnection, index: int) -> None:
        if index < closes:
            await peer.close(ws, 4000)

    peer = await run_peer(script, closes + 1, client)
    gaps = peer.gaps()
    assert gaps[-1] < 1.4, f"the backoff grew across ordinary closes (1.6 s when it does): {gaps}"
