"""The ceiling of the web stack: a bare ASGI websocket app under uvicorn
(uvloop, the websockets implementation, as yrelay) that relays every binary
message to every connection on the same path, sender included (as
y-websocket does). It answers a y-websocket sync step 1 with an empty step 2,
so the same driver speaks to it. Run as
``python -m yrelay_tools.bench.targets.broadcast --port N``."""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn

EMPTY_STEP2 = bytes((0, 1, 2, 0, 0))
rooms: dict[str, set[Any]] = {}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "websocket":
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    room = rooms.setdefault(scope["path"], set())
    room.add(send)
    try:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                break
            data = message.get("bytes")
            if not data:
                continue
            if data[:2] == b"\x00\x00":  # sync step 1: we hold nothing
                await send({"type": "websocket.send", "bytes": EMPTY_STEP2})
                continue
            frame = {"type": "websocket.send", "bytes": data}
            for peer in list(room):
                try:
                    await peer(frame)
                except Exception:  # noqa: BLE001 - a peer that left
                    room.discard(peer)
    finally:
        room.discard(send)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    uvicorn.run(app, host="127.0.0.1", port=parser.parse_args().port, log_level="warning", lifespan="off")


if __name__ == "__main__":
    main()
