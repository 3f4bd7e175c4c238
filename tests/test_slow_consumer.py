"""A client that reads nothing while others write tens of megabytes: the
server's memory stays bounded (its sends wait on the socket, missed batches
are dropped and read back from the stream later), and once the client reads
it gets every entry, contiguous and in order, and converges."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from pathlib import Path

import psutil
import pytest
import redis
import websockets

from wsraw import RawPeer
from yrelay.yjs import crdt
from yrelay_tools.testing.processes import ServerProcess

DOC = "slow"
WRITERS = 4
UPDATES_PER_WRITER = 200
CHUNK = 80 * 1024  # characters per update: 4 x 200 x 80 KiB = 64 MB written
#: Growth of the server process allowed while the reader does not read.
#: What it tells apart: a server that kept what the stuck reader did not
#: read grows by at least the data written (62.5 MiB); a bounded one by its
#: buffers and the allocator's arenas for the 80 KiB updates in flight:
#: +25.5 MiB measured on a quiet machine, +32 to +34 MiB with both cores busy
#: (more updates in flight while the server waits for the CPU; it was 32 MiB,
#: half the data, and failed there: issue 31).
RSS_BOUND = 40 * 2**20


def writer_updates(client_id: int) -> list[bytes]:
    doc = crdt.new_doc(client_id)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    for index in range(UPDATES_PER_WRITER):
        crdt.insert_text(doc, 0, (f"<{client_id}:{index}>" * CHUNK)[:CHUNK])
    return updates


class RssSampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.baseline = self.process.memory_info().rss
        self.peak = self.baseline
        self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            self.peak = max(self.peak, self.process.memory_info().rss)
            self.samples += 1


@pytest.mark.timeout(600)
async def test_a_reader_that_reads_nothing_does_not_grow_the_server(redis_url: str, tmp_path: Path):
    server = ServerProcess(redis_url, tmp_path, env={"YRELAY_GC_INTERVAL": "0"}).start()
    try:
        await _run(server, redis_url)
    finally:
        server.stop()


async def _run(server: ServerProcess, redis_url: str) -> None:
    updates = await asyncio.to_thread(lambda: {i: writer_updates(100 + i) for i in range(WRITERS)})
    written = sum(len(u) for batch in updates.values() for u in batch)
    # The slow reader: subscribes, then stops reading. Its library stops
    # reading the socket once two frames wait, so TCP pushes back on the server.
    slow = await websockets.connect(server.ws_url, max_size=None, max_queue=2)
    await slow.send(json.dumps({"op": "hello"}))
    assert json.loads(await slow.recv())["op"] == "welcome"
    await slow.send(json.dumps({"op": "subscribe", "doc": DOC}))
    assert json.loads(await slow.recv())["op"] == "subscribed"

    await asyncio.sleep(1.0)  # the server settles (validators started, first subscriptions)
    sampler = RssSampler(server.process.pid)
    sampler.start()
    started = time.monotonic()

    async def write(index: int) -> None:
        peer = await RawPeer.connect(server.ws_url)
        await peer.send({"op": "subscribe", "doc": DOC})
        await peer.expect("subscribed")
        for clock, update in enumerate(updates[index], start=1):
            await peer.send({"op": "update", "doc": DOC, "clock": clock, "update": base64.b64encode(update).decode()})
            while True:  # the answer (own entries are never delivered back)
                frame = await peer.recv(timeout=60)
                if frame["op"] in ("appended", "error"):
                    break
            assert frame["op"] == "appended", frame
        await peer.close()

    await asyncio.gather(*(write(i) for i in range(WRITERS)))
    write_seconds = time.monotonic() - started
    await asyncio.sleep(2.0)  # resends and fan-out keep running against the stuck reader
    sampler.stop.set()
    sampler.join()
    growth = sampler.peak - sampler.baseline
    client = redis.Redis.from_url(redis_url)
    stream = [entry_id.decode() for entry_id, _ in client.xrange(f"yrelay:{{{DOC}}}:stream")]
    assert len(stream) == WRITERS * UPDATES_PER_WRITER
    print(
        f"SLOW CONSUMER written {written / 2**20:.1f} MiB in {write_seconds:.1f}s, server RSS baseline "
        f"{sampler.baseline / 2**20:.1f} MiB, peak {sampler.peak / 2**20:.1f} MiB (+{growth / 2**20:.1f} MiB, "
        f"{sampler.samples} samples)"
    )
    assert growth < RSS_BOUND, f"server grew {growth / 2**20:.1f} MiB while {written / 2**20:.1f} MiB were written"

    # Now the reader reads: every entry, contiguous and in order (resends of
    # what it had not acked may repeat some), then it converges.
    received: list[str] = []
    ydoc = crdt.new_doc()
    deadline = time.monotonic() + 240
    while len(received) < len(stream):
        assert time.monotonic() < deadline, f"got {len(received)} of {len(stream)}"
        frame = json.loads(await asyncio.wait_for(slow.recv(), 60))
        if frame["op"] != "deliver":
            continue
        for entry in frame["entries"]:
            if received and _key(entry["id"]) <= _key(received[-1]):
                continue  # a resend of something already held
            received.append(entry["id"])
            crdt.apply_update(ydoc, base64.b64decode(entry["update"]))
        await slow.send(json.dumps({"op": "ack", "doc": DOC, "offset": received[-1]}))
    assert received == stream  # contiguous: no entry skipped, none out of order
    expected = crdt.new_doc()
    crdt.apply_updates(expected, [u for batch in updates.values() for u in batch])
    assert crdt.text_of(ydoc) == crdt.text_of(expected)
    await slow.close()
    assert server.running


def _key(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)
