"""Protocol drivers: one connection of the load generator to one document,
speaking yrelay's JSON frames or y-websocket's binary sync messages.

Both record what they receive the same way: for every update, the time it
arrived, keyed by :func:`edits.update_key`. A driver never applies updates to
a document (the generator must not be the bottleneck); it names them.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from typing import Any

from yrelay import protocol
from yrelay.client.client import ACK_INTERVAL
from yrelay_tools.bench.edits import read_uint, update_key, write_uint
from yrelay_tools.bench.wsclient import WsClient

try:  # the bench extra; the standard library otherwise
    import orjson

    _loads: Callable[[str | bytes], Any] = orjson.loads

    def _dumps(frame: object) -> str:
        text: str = orjson.dumps(frame).decode()  # typed here whether or not orjson is installed
        return text
except ImportError:  # pragma: no cover
    import json

    _loads = json.loads

    def _dumps(frame: object) -> str:
        return json.dumps(frame, separators=(",", ":"))


YRELAY = "yrelay"
Y_WEBSOCKET = "y-websocket"
#: The y-websocket protocol on yrelay's /yws endpoint (same messages, another path).
YWS = "yws"
PROTOCOLS = (YRELAY, Y_WEBSOCKET, YWS)


class Receipts:
    """Per update key: when the last reader of this process got it, and how many did."""

    def __init__(self) -> None:
        self.by_key: dict[int, list[float]] = {}
        self.deliveries = 0
        self.last = 0.0

    def record(self, key: int, now: float) -> None:
        entry = self.by_key.get(key)
        if entry is None:
            self.by_key[key] = [now, 1]
        else:
            entry[0] = now
            entry[1] += 1
        self.deliveries += 1
        self.last = now


class Driver:
    """One connection; ``expect`` updates of others to receive, and maybe some to send."""

    protocol: str

    def __init__(self, doc: str, receipts: Receipts | None, own_client: int | None, expect: int):
        self.doc = doc
        self.receipts = receipts  # None: a writer whose deliveries are not measured
        self.own_client = own_client
        self.expect = expect
        self.received = 0
        self.acked = 0
        self.last_ack = 0.0
        self.errors = 0
        self.last_error = ""
        self.ws: WsClient | None = None
        #: Offer permessage-deflate as Chromium does (set by the worker).
        self.deflate = False
        self._ready: asyncio.Future[None] | None = None
        self.complete = asyncio.Event()
        if expect == 0:
            self.complete.set()

    async def open(self, host: str, port: int) -> None:
        raise NotImplementedError

    def encode_update(self, clock: int, update: bytes) -> bytes | str:
        """The message that sends ``update`` (made before the clock starts)."""
        raise NotImplementedError

    def send(self, message: bytes | str) -> None:
        assert self.ws is not None
        if isinstance(message, str):
            self.ws.send_text(message)
        else:
            self.ws.send_binary(message)

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()

    def _got(self, update: bytes, now: float) -> None:
        key = update_key(update)
        if key is None or key >> 32 == self.own_client:
            return  # an empty update, or the echo of our own
        self.received += 1
        if self.receipts is not None:
            self.receipts.record(key, now)
        if self.received >= self.expect:
            self.complete.set()

    async def _wait_ready(self, what: str, timeout: float = 60.0) -> None:
        assert self._ready is not None
        try:
            await asyncio.wait_for(self._ready, timeout)
        except TimeoutError:
            raise TimeoutError(
                f"{self.doc}: no {what} after {timeout:.0f} s (got {self.received} updates, "
                f"{self.errors} errors, the last: {self.last_error or 'none'})"
            ) from None

    def _opened(self) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)


class YrelayDriver(Driver):
    """hello, subscribe; acks deliveries as yrelay's clients do (cumulatively,
    at most one ack per document per ``ACK_INTERVAL``, carrying the newest
    offset), counts ``appended``."""

    protocol = YRELAY
    #: The offset to ack once the interval is up (None: no ack due).
    _ack_due: str | None = None

    async def open(self, host: str, port: int) -> None:
        self._ready = asyncio.get_running_loop().create_future()
        self.ws = await WsClient.connect(host, port, "/ws", self._on_message, deflate=self.deflate)
        self.ws.send_text(_dumps({"op": "hello", "protocol": protocol.PROTOCOL_VERSION}))
        self.ws.send_text(_dumps({"op": "subscribe", "doc": self.doc}))
        await self._wait_ready("subscribed")

    def encode_update(self, clock: int, update: bytes) -> str:
        return _dumps({"op": "update", "doc": self.doc, "clock": clock, "update": base64.b64encode(update).decode()})

    def _on_message(self, opcode: int, data: bytes) -> None:
        frame = _loads(data)
        op = frame["op"]
        if op == "deliver":
            now = time.perf_counter()
            entries = frame["entries"]
            for entry in entries:
                self._got(base64.b64decode(entry["update"]), now)
            if self._ack_due is None:
                asyncio.get_running_loop().call_later(ACK_INTERVAL, self._send_ack)
            self._ack_due = entries[-1]["id"]
        elif op == "appended":
            self.acked += 1
            self.last_ack = time.perf_counter()
        elif op == "subscribed":
            self._opened()
        elif op == "error":
            self.errors += 1
            self.last_error = f"{frame.get('code')}: {frame.get('message')}"

    def _send_ack(self) -> None:
        offset, self._ack_due = self._ack_due, None
        if self.ws is not None and offset is not None and not self.ws.closed.done():
            self.ws.send_text(f'{{"op":"ack","doc":{_dumps(self.doc)},"offset":"{offset}"}}')


class YWebsocketDriver(Driver):
    """y-websocket's sync protocol: step 1 with an empty state vector, answer
    the server's step 1 with an empty step 2, then updates both ways."""

    protocol = Y_WEBSOCKET
    #: Where the server takes rooms: ``<prefix>/<room>``.
    path_prefix = ""

    async def open(self, host: str, port: int) -> None:
        self._ready = asyncio.get_running_loop().create_future()
        self.ws = await WsClient.connect(
            host, port, f"{self.path_prefix}/{self.doc}", self._on_message, deflate=self.deflate
        )
        self.ws.send_binary(sync_message(0, b"\x00"))  # step 1: we hold nothing
        await self._wait_ready("sync step 2")

    def encode_update(self, clock: int, update: bytes) -> bytes:
        return sync_message(2, update)

    def _on_message(self, opcode: int, data: bytes) -> None:
        if len(data) < 2 or data[0] != 0:
            return  # awareness (1) and anything else
        kind = data[1]
        if kind == 0:  # the server's step 1: we have nothing it lacks
            self.ws.send_binary(sync_message(1, b"\x00\x00"))  # type: ignore[union-attr]
            return
        length, pos = read_uint(data, 2)
        update = data[pos : pos + length]
        if kind == 1:
            self._opened()
        if kind in (1, 2) and len(update) > 2:
            self._got(update, time.perf_counter())


def sync_message(kind: int, payload: bytes) -> bytes:
    """A y-websocket sync message: messageSync (0), step1/step2/update, payload."""
    return bytes((0, kind)) + write_uint(len(payload)) + payload


class YwsDriver(YWebsocketDriver):
    """The same client against yrelay's ``/yws/<doc>`` (issue 19)."""

    protocol = YWS
    path_prefix = "/yws"


DRIVERS: dict[str, type[Driver]] = {YRELAY: YrelayDriver, Y_WEBSOCKET: YWebsocketDriver, YWS: YwsDriver}
