"""A y-websocket peer for tests: a pycrdt document behind a raw websocket
speaking y-protocols (yrelay.yjs.yprotocol), so a test controls every message."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pycrdt
import websockets

from yrelay.yjs import yprotocol
from yrelay.yjs.yprotocol import AuthMessage, AwarenessMessage, SyncMessage, SyncStep

#: What :meth:`YwsPeer.connect` raises when the server accepts the websocket
#: and then closes it with a refusal (4401 bad token, 4403 not granted): the
#: close, when it arrives before sync step 1 is sent; a timeout of the sync,
#: when it arrives after (the reader ends quietly, the sync never completes).
#: A refusal at the HTTP handshake (a foreign origin) is ``InvalidStatus``.
REFUSED_AFTER_ACCEPT = (websockets.ConnectionClosed, TimeoutError)


class YwsPeer:
    def __init__(self, ws: Any, doc: pycrdt.Doc | None = None):
        self.ws = ws
        # 32-bit client ids, as Yjs picks them (y-py, under the Python client, truncates larger ones)
        self.doc = doc if doc is not None else pycrdt.Doc(client_id=random.getrandbits(32))
        self.text = self.doc.get("text", type=pycrdt.Text)
        self.denied: list[str] = []
        self.awareness: list[bytes] = []
        self.synced = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url: str, doc: str, ydoc: pycrdt.Doc | None = None, **kwargs: Any) -> YwsPeer:
        """Connect and sync, as a stock client does on every (re)connect; ``ydoc``: the document it kept."""
        peer = cls(await websockets.connect(f"{url}/yws/{doc}", max_size=None, **kwargs), ydoc)
        await peer.ws.send(yprotocol.sync_step1(peer.doc.get_state()))
        await asyncio.wait_for(peer.synced.wait(), 10)
        return peer

    async def _read(self) -> None:
        try:
            async for data in self.ws:
                message = yprotocol.decode(data)
                if isinstance(message, SyncMessage) and message.step is SyncStep.STEP1:
                    await self.ws.send(yprotocol.sync_step2(self.doc.get_update(message.payload)))
                elif isinstance(message, SyncMessage):
                    self.doc.apply_update(message.payload)
                    if message.step is SyncStep.STEP2:
                        self.synced.set()
                elif isinstance(message, AuthMessage):
                    self.denied.append(message.reason)
                elif isinstance(message, AwarenessMessage):
                    self.awareness.append(message.update)
        except websockets.ConnectionClosed:
            pass

    async def edit(self, chunk: str) -> None:
        """Insert ``chunk`` at the end and send the update, as a stock client does."""
        before = self.doc.get_state()
        self.text += chunk
        try:
            await self.ws.send(yprotocol.sync_update(self.doc.get_update(before)))
        except websockets.ConnectionClosed:
            pass  # offline: the edit stays in the document, the next connect's sync sends it

    @property
    def closed(self) -> tuple[int, str] | None:
        """(code, reason) once the server closed the socket."""
        if self.ws.close_code is None:
            return None
        return self.ws.close_code, self.ws.close_reason

    async def close(self) -> None:
        self._reader.cancel()
        await self.ws.close()


class ReconnectingPeer:
    """A reader that behaves as a stock y-websocket client does across
    closes: it reconnects (while ``online`` is set) with its document kept,
    and every (re)connect syncs both ways (its step 1, the server's step 2;
    the server's step 1, its step 2). ``closes``: the close codes and
    reasons the server sent, in order."""

    def __init__(self, url: str, doc: str):
        self.url = f"{url}/yws/{doc}"
        self.doc = pycrdt.Doc(client_id=random.getrandbits(32))
        self.closes: list[tuple[int | None, str]] = []
        self.connects = 0
        self.online = asyncio.Event()
        self.online.set()
        self.ws: Any = None
        self._task = asyncio.create_task(self._run())

    @property
    def text(self) -> str:
        return str(self.doc.get("text", type=pycrdt.Text))

    async def _run(self) -> None:
        failures = 0
        while True:
            await self.online.wait()
            try:
                ws = await websockets.connect(self.url, max_size=None)
            except (OSError, websockets.InvalidHandshake):
                failures += 1
                await asyncio.sleep(min(0.05 * 2**failures, 1.0))  # y-websocket: 100 ms doubling, up to 2.5 s
                continue
            failures = 0
            self.ws, self.connects = ws, self.connects + 1
            try:
                await ws.send(yprotocol.sync_step1(self.doc.get_state()))
                async for data in ws:
                    message = yprotocol.decode(data)
                    if isinstance(message, SyncMessage) and message.step is SyncStep.STEP1:
                        await ws.send(yprotocol.sync_step2(self.doc.get_update(message.payload)))
                    elif isinstance(message, SyncMessage):
                        self.doc.apply_update(message.payload)
            except websockets.ConnectionClosed:
                pass
            self.ws = None
            self.closes.append((ws.close_code, ws.close_reason))
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        self._task.cancel()
        if self.ws is not None:
            await self.ws.close()


class RecordedSocket:
    """What a :class:`~yrelay.app.wire.yws.YwsCodec` writes to, recording what it
    was given (tests of an untracked subscription alone, without a socket)."""

    def __init__(self, ctx: Any):
        self.services = ctx.services
        self.sent: list[bytes] = []
        self.closed: list[tuple[int, str]] = []

    async def send(self, data: bytes) -> None:
        self.sent.append(data)

    async def close(self, code: int, reason: str) -> None:
        self.closed.append((code, reason))


class _Alone:
    """The owner of a subscription that belongs to no connection: told nothing."""

    def answered(self, doc: str) -> None:
        pass

    def booked(self, nbytes: int) -> None:
        pass

    async def deleted(self, doc: str) -> None:
        pass


def untracked_subscription(ctx: Any, doc: str, socket: Any = None) -> tuple[Any, Any]:
    """A ``/yws`` connection's subscription to ``doc`` (untracked, speaking
    y-protocols to ``socket``, a :class:`RecordedSocket` by default), started:
    (subscription, socket)."""
    from yrelay.app.core.subscription import Subscription
    from yrelay.app.wire.yws import YwsCodec

    socket = socket or RecordedSocket(ctx)
    subscription = Subscription(
        ctx.services.reads, doc, "reader", YwsCodec(socket, doc, None), None, owner=_Alone(), tracked=False
    )
    subscription.start()
    return subscription, socket
