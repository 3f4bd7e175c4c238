"""A large paste end to end: one Y.Text insert from the Python client,
sent in parts (feature update_parts), reassembled, validated, admitted and
appended by an in-process server on a private redis-server, and delivered
to a second client. Prints seconds from the insert to the ack and to the
reader holding the whole text.

    .venv/bin/python bench/large_paste.py [--mib 5 15.5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

import uvicorn

from yrelay.app import create_app
from yrelay.client import YrelayClient
from yrelay.config import Settings
from yrelay.storage.embedded import RedisProcess, free_port
from yrelay.yjs import crdt


async def paste(url: str, mib: float) -> tuple[float, float]:
    writer, reader = await YrelayClient(url).connect(), await YrelayClient(url).connect()
    try:
        wdoc, rdoc = await writer.subscribe(f"paste-{mib}"), await reader.subscribe(f"paste-{mib}")
        size = int(mib * 1024 * 1024)
        text = ("0123456789abcdef" * (size // 16 + 1))[:size]
        started = time.perf_counter()
        crdt.insert_text(wdoc.ydoc, 0, text)
        await writer.wait_idle(300)
        acked = time.perf_counter() - started
        while len(rdoc.text) != size:
            await asyncio.sleep(0.005)
        if writer.errors:
            raise RuntimeError(f"errors: {writer.errors}")
        return acked, time.perf_counter() - started
    finally:
        await writer.close()
        await reader.close()


async def main(sizes: list[float]) -> None:
    os.environ.setdefault("YRELAY_INSECURE_NO_AUTH", "1")
    with tempfile.TemporaryDirectory() as tmp, RedisProcess(Path(tmp)) as redis:
        settings = Settings.from_env(data_dir=Path(tmp), gc_interval=0)
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(settings, redis.url),
                host="127.0.0.1",
                port=port,
                log_level="warning",
                **settings.uvicorn_options(),
            )
        )
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        try:
            for mib in sizes:
                acked, delivered = await paste(f"ws://127.0.0.1:{port}/ws", mib)
                print(f"{mib:6.1f} MiB paste: acked after {acked:.2f} s, whole at the reader after {delivered:.2f} s")
        finally:
            server.should_exit = True
            await task


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=float, nargs="+", default=[5.0, 15.5])
    asyncio.run(main(parser.parse_args().mib))
