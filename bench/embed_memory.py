"""Memory per idle connection: yrelay served standalone (``create_app``:
``/ws`` taken straight from the ASGI call) against yrelay embedded in a host
FastAPI app under ``/collab``: ``included`` (``app.include_router``: every
middleware layer and both routers in front of the websocket), ``installed``
(``relay.install``: the websocket taken by an innermost user middleware),
and ``installed+mw`` (the host has two common middlewares of its own, CORS
and an ``@app.middleware("http")`` one).

Each server runs in its own process on one redis-server; a client process
opens N connections (hello + subscribe, permessage-deflate offered as a
browser does) and holds them. Figures: the server's RSS growth per
connection (tracemalloc off) and tracemalloc's traced growth per connection
(a second run with it on).

    .venv/bin/python bench/embed_memory.py [--connections 1000] [--modes standalone,included,installed,installed+mw]
        [--no-deflate]

``--modes standalone`` with ``PYTHONPATH=<another checkout>`` measures that
build's standalone server (mode ``standalone`` does not need Relay).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

MODES = ("standalone", "included", "installed", "installed+mw")
DOCS = 100


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def settings():
    from yrelay.config import Settings

    # the per-client limits off, as yrelay bench does: one address opening 1,000 sockets
    return Settings.from_env(
        insecure_no_auth=True,
        max_connections_per_address=0,
        gc_interval=0,
        max_subscriptions_per_subject=0,
        admission_rate=0,
    )


def build(mode: str, redis_url: str):
    """The app of one mode."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from fastapi.middleware.cors import CORSMiddleware

    from yrelay.app import create_app

    if mode == "standalone":  # no Relay import: the same mode measures a build from before it (PYTHONPATH)
        return create_app(settings(), redis_url)
    from yrelay import Relay

    relay = Relay(settings(), redis_url=redis_url)

    @asynccontextmanager
    async def lifespan(app):
        async with relay.lifespan():
            yield

    app = FastAPI(lifespan=lifespan)
    if mode == "included":
        app.include_router(relay.router, prefix="/collab")
    else:
        relay.install(app, prefix="/collab")
    if mode.endswith("+mw"):
        app.add_middleware(CORSMiddleware, allow_origins=["https://app.example"])

        @app.middleware("http")
        async def request_id(request, call_next):
            response = await call_next(request)
            response.headers["x-request-id"] = "1"
            return response

    return app


async def serve(mode: str, redis_url: str, port: int, trace: bool) -> None:
    """The server process: answers ``measure`` on stdin with its RSS and traced bytes."""
    import uvicorn

    if trace:
        tracemalloc.start()
    server = uvicorn.Server(
        uvicorn.Config(
            build(mode, redis_url), host="127.0.0.1", port=port, log_level="warning", **settings().uvicorn_options()
        )
    )  # type: ignore[arg-type]
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while (await loop.run_in_executor(None, sys.stdin.readline)).strip() != "quit":
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] if trace else 0
        print(json.dumps({"rss": rss(), "traced": traced}), flush=True)
    server.should_exit = True
    await task


async def hold(url: str, count: int, batch: int = 50, deflate: bool = True) -> list:
    import websockets

    async def one(i: int):
        # permessage-deflate offered (and accepted by uvicorn) as browsers do, unless --no-deflate
        ws = await websockets.connect(url, max_size=None, compression="deflate" if deflate else None)
        await ws.send(json.dumps({"op": "hello"}))
        await ws.send(json.dumps({"op": "subscribe", "doc": f"idle-{i % DOCS}"}))
        while json.loads(await ws.recv())["op"] != "subscribed":
            pass
        return ws

    sockets = []
    for start in range(0, count, batch):
        sockets += await asyncio.gather(*(one(i) for i in range(start, min(count, start + batch))))
    return sockets


def measure(mode: str, redis_url: str, connections: int, trace: bool, deflate: bool) -> dict[str, float]:
    from yrelay.storage.embedded import free_port

    port = free_port()
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", mode, "--redis-url", redis_url, "--port", str(port)]
        + (["--trace"] if trace else []),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin and child.stdout
    assert child.stdout.readline().strip() == "ready"

    def sample() -> dict[str, int]:
        child.stdin.write("measure\n")  # type: ignore[union-attr]
        child.stdin.flush()  # type: ignore[union-attr]
        return json.loads(child.stdout.readline())  # type: ignore[union-attr]

    path = "/ws" if mode == "standalone" else "/collab/ws"
    url = f"ws://127.0.0.1:{port}{path}"

    async def run() -> tuple[dict[str, int], dict[str, int]]:
        for ws in await hold(url, 100, deflate=deflate):  # warm-up: first-use allocations are not per connection
            await ws.close()
        await asyncio.sleep(0.5)
        before = sample()
        sockets = await hold(url, connections, deflate=deflate)
        await asyncio.sleep(1.0)
        after = sample()
        for ws in sockets:
            await ws.close()
        return before, after

    try:
        before, after = asyncio.run(run())
    finally:
        child.stdin.write("quit\n")
        child.stdin.flush()
        child.wait(30)
    return {key: (after[key] - before[key]) / connections for key in ("rss", "traced")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--serve", choices=MODES)
    parser.add_argument("--redis-url")
    parser.add_argument("--port", type=int)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--no-deflate", action="store_true", help="clients that do not offer permessage-deflate")
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.redis_url, args.port, args.trace))
        return
    import resource

    from yrelay.storage.embedded import RedisProcess

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as tmp, RedisProcess(Path(tmp)) as redis:
        print("| server | connections | RSS per connection (kB) | traced per connection (kB) |")
        print("| --- | --- | --- | --- |")
        for mode in args.modes.split(","):
            plain = measure(mode, redis.url, args.connections, trace=False, deflate=not args.no_deflate)
            traced = measure(mode, redis.url, args.connections, trace=True, deflate=not args.no_deflate)
            print(
                f"| {mode} | {args.connections:,} | {plain['rss'] / 1024:.1f} | {traced['traced'] / 1024:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
