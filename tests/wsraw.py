"""A bare protocol peer for tests that must control every frame."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import websockets


class RawPeer:
    def __init__(self, ws: Any):
        self.ws = ws
        self.session: str | None = None
        #: Frames skipped unless asked for by name (``expect("synced")``):
        #: additive frames that tests written before them do not expect.
        self.quiet = {"synced"}

    @classmethod
    async def connect(cls, url: str, session: str | None = None, address: str | None = None) -> RawPeer:
        """``address``: the client address a trusted proxy names (``X-Forwarded-For``)."""
        headers = {"X-Forwarded-For": address} if address else None
        peer = cls(await websockets.connect(url, max_size=None, additional_headers=headers))
        await peer.send({"op": "hello", "session": session})
        welcome = await peer.expect("welcome")
        peer.session = welcome["session"]
        return peer

    async def send(self, frame: dict[str, Any] | str) -> None:
        await self.ws.send(frame if isinstance(frame, str) else json.dumps(frame))

    async def recv(self, timeout: float = 5.0, wanted: str | None = None) -> dict[str, Any]:
        while True:
            frame = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
            if frame.get("op") not in self.quiet or frame.get("op") == wanted:
                return frame

    async def expect(self, op: str, timeout: float = 5.0) -> dict[str, Any]:
        frame = await self.recv(timeout, wanted=op)
        assert frame["op"] == op, frame
        return frame

    async def nothing(self, timeout: float = 0.5) -> None:
        try:
            frame = await self.recv(timeout)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected frame {frame}")

    async def update(self, doc: str, clock: int, update: bytes) -> dict[str, Any]:
        """Send an update and return the server's answer to it (deliveries of
        other entries that arrive first are skipped)."""
        await self.send({"op": "update", "doc": doc, "clock": clock, "update": base64.b64encode(update).decode()})
        while True:
            frame = await self.recv()
            if frame["op"] != "deliver":
                return frame

    async def close(self) -> None:
        await self.ws.close()
