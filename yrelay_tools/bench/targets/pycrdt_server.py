"""pycrdt-websocket as the issue describes it: its ASGIServer under uvicorn
(uvloop, like yrelay), one in-memory room per path. Run as
``python -m yrelay_tools.bench.targets.pycrdt_server --port N``."""

from __future__ import annotations

import argparse
import asyncio

import uvicorn
from pycrdt.websocket import ASGIServer, WebsocketServer


async def serve(port: int) -> None:
    websocket_server = WebsocketServer()
    config = uvicorn.Config(
        ASGIServer(websocket_server), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    async with websocket_server:
        await uvicorn.Server(config).serve()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    try:
        import uvloop

        uvloop.run(serve(port))
    except ImportError:  # pragma: no cover
        asyncio.run(serve(port))


if __name__ == "__main__":
    main()
