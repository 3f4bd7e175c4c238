"""Where an idle connection's memory goes: tracemalloc's growth per
connection, by package, in a standalone yrelay server (issue 20).

A server process (``create_app`` under uvicorn with ``uvicorn_options()``,
tracemalloc on) and a client process opening N connections as the bench's
idle scenario does (hello, subscribe to one of 100 documents, permessage-
deflate offered as Chromium does unless ``--no-deflate``). The server's
traced allocations before and after are compared by file, grouped by package
(``yrelay``, ``asyncio``, ``uvicorn``, ``websockets``...). zlib's own buffers
are allocated by C, not traced: the RSS figure of ``yrelay bench idle`` holds them.

    PYTHONPATH=. .venv/bin/python bench/idle_profile.py \\
        [--connections 1000] [--no-deflate] [--env YRELAY_X=1] [--embedded]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path

DOCS = 100


def package(filename: str) -> str:
    """``.../site-packages/uvicorn/x.py`` -> ``uvicorn``; ``.../lib/python3.11/asyncio/x.py`` -> ``asyncio``."""
    parts = Path(filename).parts
    for anchor in ("site-packages", "yrelay", "yrelay_tools"):
        if anchor in parts:
            at = parts.index(anchor)
            return parts[at + 1] if anchor == "site-packages" and at + 1 < len(parts) else anchor
    for i, part in enumerate(parts):
        if part.startswith("python3"):
            return parts[i + 1].removesuffix(".py") if i + 1 < len(parts) else part
    return filename


async def serve(redis_url: str, port: int) -> None:
    import uvicorn

    from yrelay.app import create_app
    from yrelay.config import Settings

    tracemalloc.start(int(os.environ.get("IDLE_PROFILE_FRAMES", "1")))
    settings = Settings.from_env(
        insecure_no_auth=True,
        max_connections_per_address=0,
        gc_interval=0,
        max_subscriptions_per_subject=0,
        admission_rate=0,
        updates_per_second=0,
    )
    if os.environ.get("IDLE_PROFILE_EMBEDDED"):  # the relay in a FastAPI host app (the bench's yrelay-embedded)
        from yrelay import Relay
        from yrelay_tools.bench.targets.embedded import host_app

        app = host_app(Relay(settings, redis_url=redis_url))
    else:
        app = create_app(settings, redis_url)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **settings.uvicorn_options())
    )  # type: ignore[arg-type]
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    before: tracemalloc.Snapshot | None = None
    only = os.environ.get("IDLE_PROFILE_ONLY", "")
    while (await loop.run_in_executor(None, sys.stdin.readline)).strip() != "quit":
        gc.collect()
        snapshot = tracemalloc.take_snapshot()
        if before is None:
            before = snapshot
            print("{}", flush=True)
            continue
        grown: Counter[str] = Counter()
        for stat in snapshot.compare_to(before, "filename"):
            grown[package(stat.traceback[0].filename)] += stat.size_diff
        lines = [
            (
                " <- ".join(
                    f"{frame.filename.split('site-packages/')[-1].split('python3.11/')[-1]}:{frame.lineno}"
                    for frame in stat.traceback
                ),
                stat.size_diff,
            )
            for stat in snapshot.compare_to(before, "traceback")
            if only in ("", package(stat.traceback[-1].filename))
        ][:30]
        print(json.dumps({"packages": dict(grown), "lines": lines}), flush=True)
    server.should_exit = True
    await task


async def hold(port: int, count: int, deflate: bool) -> list:
    from yrelay_tools.bench.wsclient import WsClient

    async def one(i: int) -> WsClient:
        subscribed = asyncio.get_running_loop().create_future()

        def on_message(_: int, data: bytes) -> None:
            if json.loads(data).get("op") == "subscribed" and not subscribed.done():
                subscribed.set_result(None)

        offer = {"deflate": True} if deflate else {}  # --no-deflate also runs against a build before issue 20
        ws = await WsClient.connect("127.0.0.1", port, "/ws", on_message, **offer)
        ws.send_text(json.dumps({"op": "hello", "protocol": 1}))
        ws.send_text(json.dumps({"op": "subscribe", "doc": f"idle-{i % DOCS}"}))
        await asyncio.wait_for(subscribed, 60)
        return ws

    sockets = []
    for start in range(0, count, 50):
        sockets += await asyncio.gather(*(one(i) for i in range(start, min(count, start + 50))))
    return sockets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--no-deflate", action="store_true")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server")
    parser.add_argument("--frames", type=int, default=1, help="frames of each top allocation's traceback")
    parser.add_argument("--only", default="", help="top lines allocated in this package only (yrelay, asyncio...)")
    parser.add_argument("--embedded", action="store_true", help="the relay installed in a FastAPI host app")
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--redis-url")
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.redis_url, args.port))
        return
    import resource

    from yrelay.storage.embedded import RedisProcess, free_port

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    env = {
        **os.environ,
        **dict(item.split("=", 1) for item in args.env),
        "IDLE_PROFILE_FRAMES": str(args.frames),
        **({"IDLE_PROFILE_EMBEDDED": "1"} if args.embedded else {}),
        "IDLE_PROFILE_ONLY": args.only,
    }
    with tempfile.TemporaryDirectory() as tmp, RedisProcess(Path(tmp)) as redis:
        port = free_port()
        child = subprocess.Popen(
            [sys.executable, __file__, "--serve", "--redis-url", redis.url, "--port", str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert child.stdin and child.stdout

        def sample() -> dict:
            child.stdin.write("measure\n")  # type: ignore[union-attr]
            child.stdin.flush()  # type: ignore[union-attr]
            return json.loads(child.stdout.readline())  # type: ignore[union-attr]

        async def run() -> dict:
            for ws in await hold(port, 100, not args.no_deflate):  # first-use allocations are not per connection
                ws.close()
            await asyncio.sleep(0.5)
            sample()
            sockets = await hold(port, args.connections, not args.no_deflate)
            await asyncio.sleep(1.0)
            grown = sample()
            for ws in sockets:
                ws.close()
            return grown

        try:
            assert child.stdout.readline().strip() == "ready"
            grown = asyncio.run(run())
        finally:
            child.stdin.write("quit\n")
            child.stdin.flush()
            child.wait(30)
    packages, lines = grown["packages"], grown["lines"]
    print(f"traced per connection: {sum(packages.values()) / args.connections / 1024:.1f} kB")
    for name, size in sorted(packages.items(), key=lambda item: -item[1]):
        if abs(size) / args.connections >= 50:
            print(f"  {name}: {size / args.connections / 1024:.2f} kB")
    print("top lines (bytes per connection):")
    for where, size in lines:
        print(f"  {size / args.connections:7.0f}  {where}")


if __name__ == "__main__":
    main()
