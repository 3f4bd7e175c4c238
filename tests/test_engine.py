"""The server's CRDT engine (issue 16): state vectors are decoded and bounded
before any engine sees them, sync answers and GC folds run in engine
workers under a deadline, and their cost stays near-linear however the
stream is ordered."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import psutil
import pycrdt
import pytest
import websockets

from engines import needs_ypy
from gcutil import append_at
from test_reconciliation import varint
from wsraw import RawPeer
from yrelay.auth import issue_token
from yrelay.storage.reads import DocumentStore
from yrelay.yjs import crdt, engine, update_format
from yrelay.yjs.engine_pool import EngineFailed, EnginePool
from yrelay_tools.testing.processes import ServerProcess

#: y-py 0.6.2 sizes an allocation by this vector's count (~146 GB) and aborts.
HOSTILE_VECTOR = base64.b64decode("/////w8=")
BAD_VECTORS = [
    HOSTILE_VECTOR,
    b"\x02\x01\x01",  # two pairs claimed, one and a half present
    b"\x01\x01\x01\x00",  # trailing byte
    b"\x01\x80\x80\x80\x80\x80\x80\x80\x80\x01\x01",  # client id 2**56 (a nine-byte varint)
    b"\x01\x01\x80\x80\x80\x80\x80\x80\x80\x10",  # clock 2**53: past JavaScript's exact integers
    b"",
]
SECRET = "engine-test-secret-0123456789abcdef"


def one_character_chain(count: int, client_id: int = 7) -> list[bytes]:
    """``count`` updates of one client, each appending one character: each
    depends on the one before it."""
    doc = crdt.new_doc(client_id)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    for index in range(count):
        crdt.insert_text(doc, index, "abcdefghij"[index % 10])
    return updates


def text_of_update(update: bytes) -> str:
    doc = crdt.new_doc()
    crdt.apply_update(doc, update)
    return crdt.text_of(doc)


# ------------------------------------------------------------ pure decoding


def test_state_vectors_are_decoded_and_bounded():
    for bad in BAD_VECTORS:
        with pytest.raises(update_format.MalformedUpdate):
            update_format.decode_state_vector(bad)
        with pytest.raises(crdt.InvalidUpdate):
            crdt.check_state_vector(bad)
    ydoc = crdt.new_doc(2**53 - 1)
    crdt.insert_text(ydoc, 0, "abc")
    assert update_format.decode_state_vector(crdt.state_vector(ydoc)) == {2**53 - 1: 3}
    pdoc = pycrdt.Doc(client_id=12345)
    pdoc.get("text", type=pycrdt.Text).insert(0, "hello")
    assert update_format.decode_state_vector(pdoc.get_state()) == {12345: 5}
    assert update_format.decode_state_vector(b"\x00") == {}


@pytest.mark.parametrize("engine_name", [crdt.PYCRDT, pytest.param(crdt.YPY, marks=needs_ypy)])
def test_y_py_never_sees_a_hostile_state_vector(engine_name):
    """Before the bound, this call aborted the whole process with y-py (run in
    a child so that the old behaviour fails this test instead of ending the run)."""
    code = (
        f"import base64; from yrelay import crdt; d = crdt.new_doc(engine={engine_name!r}); "
        "crdt.insert_text(d, 0, 'x')\n"
        "try:\n    crdt.encode_state(d, base64.b64decode('/////w8='))\n"
        "except crdt.InvalidUpdate as e:\n    print('refused', e)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("refused"), (result.returncode, result.stderr[-300:])


def test_causal_order_puts_each_clients_updates_in_clock_order():
    a, b = one_character_chain(5, client_id=1), one_character_chain(4, client_id=2)
    both = crdt.new_doc(3)
    crdt.apply_update(both, a[0])
    crdt.apply_update(both, b[0])
    crdt.insert_text(both, 0, "z")
    merged = crdt.encode_state(both)  # client 1 from clock 0, client 2 from clock 0, client 3
    stored = [b[3], a[4], a[2], b[1], b[2], a[3], a[1], merged]
    ordered = update_format.causal_order(stored)
    assert sorted(ordered) == sorted(stored)
    assert ordered.index(merged) < ordered.index(a[1]) < ordered.index(a[2]) < ordered.index(a[3]) < ordered.index(a[4])
    assert ordered.index(merged) < ordered.index(b[1]) < ordered.index(b[2]) < ordered.index(b[3])
    assert update_format.causal_order([b"\xff", a[1]]) == [b"\xff", a[1]]  # undecodable and unplaceable: kept, in order


# ------------------------------------------------------------- the engines


def test_both_engines_fold_a_reversed_chain_completely():
    updates = one_character_chain(1500)
    fold = engine.fold(b"", updates[::-1])
    assert fold.held == 1500
    reloaded = crdt.new_doc()
    crdt.apply_update(reloaded, fold.snapshot)
    assert len(crdt.text_of(reloaded)) == 1500
    assert len(text_of_update(crdt.merge_updates(updates[::-1]))) == 1500


def test_a_fold_stops_before_an_update_whose_dependency_is_missing():
    updates = one_character_chain(10)
    fold = engine.fold(b"", updates[:3] + updates[4:])  # the fourth never arrived
    assert fold.held == 3
    assert engine.fold(fold.snapshot, updates[3:]).held == 7  # it arrives: everything lands


def test_the_sync_answer_holds_what_the_peer_lacks_and_where_the_stream_is_held():
    updates = one_character_chain(100)
    peer = crdt.new_doc()
    crdt.apply_updates(peer, updates[:40])
    answer = engine.sync_answer(crdt.state_vector(peer), updates[0], updates[1:][::-1])
    crdt.apply_update(peer, answer.diff)
    assert len(crdt.text_of(peer)) == 100 and answer.held == 99
    assert update_format.decode_state_vector(answer.state_vector) == {7: 100}
    with pytest.raises(crdt.InvalidUpdate):
        engine.sync_answer(HOSTILE_VECTOR, b"", updates)


async def test_the_pool_cuts_off_a_hanging_or_dying_worker_and_serves_on():
    pool = EnginePool(workers=1, timeout=0.5, module="yrelay_tools.testing.hanging_engine")
    updates = one_character_chain(3)
    try:
        with pytest.raises(EngineFailed):
            await pool.sync_answer(b"\x00", b"", [*updates, b"HANG"])
        with pytest.raises(EngineFailed):
            await pool.fold(b"", [*updates, b"DIE"])
        answer = await pool.sync_answer(b"\x00", b"", updates)
        assert answer.held == 3 and pool.failures == 2 and pool.restarts >= 3
        with pytest.raises(crdt.InvalidUpdate):
            await pool.sync_answer(HOSTILE_VECTOR, b"", updates)
    finally:
        await pool.stop()


async def test_a_cancelled_caller_leaves_no_reply_behind():
    """The worker finishes the request of a caller that went away; the next
    caller gets its own answer, not the stale one."""
    pool = EnginePool(workers=1, timeout=5.0)
    big, small = one_character_chain(3000), one_character_chain(2, client_id=9)
    try:
        first = asyncio.create_task(pool.fold(b"", big[::-1]))
        await asyncio.sleep(0.05)
        first.cancel()
        fold = await pool.fold(b"", small)
        assert fold.held == 2 and len(text_of_update(fold.snapshot)) == 2
    finally:
        await pool.stop()


async def test_warmed_workers_answer_the_first_request_without_a_restart():
    """Started before the first request (the server does it before it takes
    clients): the first fold finds its worker running."""
    pool = EnginePool(workers=2, timeout=5.0)
    try:
        pool.warm_up()
        await pool.warmed()
        assert all(worker.process is not None and worker.process.returncode is None for worker in pool._workers)
        fold = await pool.fold(b"", one_character_chain(3))
        assert fold.held == 3 and pool.restarts == 0
    finally:
        await pool.stop()
    assert all(worker.process is None for worker in pool._workers)


async def test_a_worker_that_cannot_start_is_started_by_the_first_request_instead():
    pool = EnginePool(workers=1, timeout=5.0, module="yrelay_tools.testing.no_such_engine")
    try:
        pool.warm_up()
        await pool.warmed()  # logged, not raised: the server starts anyway
        with pytest.raises(EngineFailed):
            await pool.fold(b"", one_character_chain(1))
    finally:
        await pool.stop()


# ------------------------------------------------- over a real server, Redis


async def reversed_stream(redis_client, doc: str, count: int) -> list[bytes]:
    """``count`` one-character updates stored in reverse dependency order,
    straight into the stream (the API's causal admission would refuse them)."""
    updates = one_character_chain(count)
    await append_at(redis_client, doc, list(range(1, count + 1)), updates[::-1])
    return updates


#: Round trips a bystander makes at the least (tests count on more than 20).
MIN_PINGS = 25


@asynccontextmanager
async def bystander(ping: Callable[[], Awaitable[None]]) -> AsyncIterator[list[float]]:
    """Another connection pinging every 5 ms while the body runs: its slowest
    round trip bounds how long the server's event loop paused."""
    round_trips: list[float] = []
    stop = asyncio.Event()

    async def run() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            await ping()
            round_trips.append(time.perf_counter() - started)
            await asyncio.sleep(0.005)

    task = asyncio.create_task(run())
    await asyncio.sleep(0.1)
    try:
        yield round_trips
    finally:
        await asyncio.sleep(0.1)
        # At least MIN_PINGS round trips, however slow the machine: their
        # count depended on how many fit in 0.2 s plus the body ('19 > 20'
        # with both cores busy, issue 31), a figure of the machine.
        while len(round_trips) < MIN_PINGS and not task.done():
            await asyncio.sleep(0.01)
        stop.set()
        await task


def loop_cpu(server: ServerProcess) -> float:
    """CPU seconds the server's main thread, its event loop, has used so far.

    What an operation costs on the loop shows here whatever else the machine
    runs; a bystander's round trip also waits for a core, so on a busy machine
    it measures the machine (a ping of 108 ms with two suites on 2 cores, no
    operation on the loop; issue 31)."""
    assert server.process is not None
    pid = server.process.pid
    [main] = [thread for thread in psutil.Process(pid).threads() if thread.id == pid]
    return main.user_time + main.system_time


def raw_ping(peer: RawPeer) -> Callable[[], Awaitable[None]]:
    async def ping() -> None:
        await peer.send({"op": "ping"})
        await peer.expect("pong")

    return ping


@pytest.fixture
def server(redis_url, tmp_path):
    """A server in its own process (GC off), so that what is measured is its
    event loop, not this test's."""
    process = ServerProcess(redis_url, tmp_path, env={"YRELAY_GC_INTERVAL": "0"}).start()
    yield process
    process.stop()


async def test_sync_over_1500_reversed_updates_answers_within_200ms(server, redis_client):
    await reversed_stream(redis_client, "rev", 1500)
    peer, other = await RawPeer.connect(server.ws_url), await RawPeer.connect(server.ws_url)
    await peer.send({"op": "subscribe", "doc": "warm-up"})
    await peer.expect("subscribed")
    await peer.send({"op": "sync", "doc": "warm-up", "state_vector": base64.b64encode(b"\x00").decode()})
    await peer.expect("sync_reply", timeout=10)  # the engine worker has started (bounded: not this test)
    await peer.send({"op": "subscribe", "doc": "rev", "offset": "1500-0"})  # claims all: nothing delivered
    await peer.expect("subscribed")
    async with bystander(raw_ping(other)) as round_trips:
        loop_before = loop_cpu(server)
        started = time.perf_counter()
        await peer.send({"op": "sync", "doc": "rev", "state_vector": base64.b64encode(b"\x00").decode()})
        parts = [await peer.expect("sync_reply")]
        while len(parts) < parts[0].get("parts", 1):
            parts.append(await peer.expect("sync_reply"))
        elapsed = time.perf_counter() - started
        on_loop = loop_cpu(server) - loop_before
    await peer.close(), await other.close()
    diff = b"".join(base64.b64decode(part["update"]) for part in parts)
    print(
        f"sync over 1500 reversed: {elapsed * 1000:.1f} ms; {len(round_trips)} pings, "
        f"slowest {max(round_trips) * 1000:.1f} ms; event loop CPU {on_loop * 1000:.1f} ms"
    )
    assert len(text_of_update(diff)) == 1500 and parts[-1]["offset"] == "1500-0"
    # What the design promises, in terms the machine's load does not change
    # (the bounds were figures of a quiet machine, "answered < 200 ms" and a
    # ping "< 100 ms", which a busy one misses with no fault of the server):
    # the answer is not the old re-apply loop (9.1 s for this stream), and it
    # is computed in an engine worker: the event loop's own CPU over the whole
    # exchange (the stream read, the answer sent, the bystander's pings) stays
    # far below what the fold costs (10 ms quiet, in clock ticks of 10 ms).
    assert elapsed < 5.0, f"sync answered in {elapsed * 1000:.0f} ms"
    assert on_loop < 0.1, f"the event loop spent {on_loop * 1000:.0f} ms of CPU"


async def test_a_megabyte_state_vector_is_checked_off_the_event_loop(server):
    """Decoding ~90,000 pairs in pure Python takes 0.16-0.3 s: a vector past the
    in-loop precheck is decoded by the worker, before pycrdt sees it."""
    pairs = 90_000
    hostile = (
        varint(pairs)
        + b"".join(varint(2**40 + i) + varint(2**30) for i in range(pairs - 1))
        + varint(1)
        + varint(2**53)
    )  # the last clock is past 2**53
    frame = {"op": "sync", "doc": "d", "state_vector": base64.b64encode(hostile).decode()}
    peer, other = await RawPeer.connect(server.ws_url), await RawPeer.connect(server.ws_url)
    await peer.send({"op": "subscribe", "doc": "d"})
    await peer.expect("subscribed")
    async with bystander(raw_ping(other)) as round_trips:
        loop_before = loop_cpu(server)
        await peer.send(frame)
        refused = await peer.expect("error", timeout=10)
        on_loop = loop_cpu(server) - loop_before
    assert (refused["code"], refused["doc"]) == ("malformed_frame", "d")
    await peer.send({"op": "sync", "doc": "d", "state_vector": base64.b64encode(b"\x00").decode()})
    await peer.expect("sync_reply", timeout=10)
    await peer.close(), await other.close()
    print(
        f"1 MB hostile state vector: {len(round_trips)} pings, slowest {max(round_trips) * 1000:.1f} ms; "
        f"event loop CPU {on_loop * 1000:.1f} ms"
    )
    # Decoded off the loop: decoding it on the loop costs 160 ms of CPU (this
    # 2-core machine, update_format.decode_state_vector alone); the loop's own
    # CPU over the exchange (the frame's base64, the pings) was 30-40 ms. CPU,
    # not a ping's wait, which measures a busy machine.
    assert on_loop < 0.12, f"the event loop spent {on_loop * 1000:.0f} ms of CPU"


async def test_gc_folds_1500_reversed_updates_within_a_second(redis_url, redis_client, tmp_path):
    """The server's own GC pass (``POST /ops/gc``), engine worker start included."""
    await reversed_stream(redis_client, "rev", 1500)
    server = ServerProcess(redis_url, tmp_path, env={"YRELAY_GC_INTERVAL": "0", "YRELAY_OPS_TOKEN": "ops"}).start()
    try:
        other = await RawPeer.connect(server.ws_url)
        async with (
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=30) as ops,
            bystander(raw_ping(other)) as round_trips,
        ):
            started = time.perf_counter()
            answer = await ops.post("/ops/gc", json={"doc": "rev"}, headers={"Authorization": "Bearer ops"})
            elapsed = time.perf_counter() - started
        await other.close()
    finally:
        server.stop()
    [report] = answer.json()["reports"]
    print(
        f"GC pass over 1500 reversed: {elapsed * 1000:.1f} ms; {len(round_trips)} pings, "
        f"slowest {max(round_trips) * 1000:.1f} ms"
    )
    assert (report["folded"], report["trimmed"], report["blocked_at"], report["error"]) == (1500, 1500, None, None)
    ydoc, offset = await DocumentStore(redis_client).load_document("rev")
    assert len(crdt.text_of(ydoc)) == 1500 and str(offset) == "1500-0"
    # What the design promises, in terms the machine's load does not change
    # (both bounds were wall-clock figures of a quiet machine: "< 1 s" and a
    # ping "< 100 ms", the latter failed at 108 ms with two suites sharing 2
    # cores): the fold is not the old re-apply loop (13.9 s for this stream,
    # quiet), and the event loop was never held for the pass: no ping waited
    # half as long as the pass itself, as one would if the fold ran in it.
    assert elapsed < 5.0, f"GC pass took {elapsed * 1000:.0f} ms"
    assert max(round_trips) < elapsed / 2, f"a ping waited {max(round_trips) * 1000:.0f} ms of {elapsed * 1000:.0f}"


class TokenPeer:
    """A raw connection that authenticates with a token in ``hello``."""

    def __init__(self, ws) -> None:
        self.ws = ws

    @classmethod
    @asynccontextmanager
    async def open(cls, url: str, docs: list[str], perm: str) -> AsyncIterator[TokenPeer]:
        async with websockets.connect(url, max_size=None) as ws:
            peer = cls(ws)
            await peer.send({"op": "hello", "token": issue_token(SECRET, f"{perm}er", docs, perm, 600)})
            assert (await peer.until("welcome"))["auth"]["permission"] == perm
            yield peer

    async def send(self, frame: dict) -> None:
        await self.ws.send(json.dumps(frame))

    async def until(self, op: str, timeout: float = 5.0) -> dict:
        while True:
            frame = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
            if frame["op"] in (op, "error"):
                return frame

    async def ping(self) -> None:
        await self.send({"op": "ping"})
        await self.until("pong")


async def test_a_read_only_clients_hostile_sync_is_refused_and_nobody_else_notices(redis_url, tmp_path):
    """The server in its own process: before the fix, this sync aborted it."""
    server = ServerProcess(
        redis_url, tmp_path, env={"YRELAY_INSECURE_NO_AUTH": "0", "YRELAY_AUTH_SECRET": SECRET}
    ).start()
    try:
        updates = one_character_chain(3)
        async with (
            TokenPeer.open(server.ws_url, ["d"], "write") as writer,
            TokenPeer.open(server.ws_url, ["d"], "read") as reader,
            TokenPeer.open(server.ws_url, ["other"], "read") as other,
        ):
            for peer in (writer, reader):
                await peer.send({"op": "subscribe", "doc": "d"})
                assert (await peer.until("subscribed"))["op"] == "subscribed"
            async with bystander(other.ping) as round_trips:
                loop_before = loop_cpu(server)
                for bad in BAD_VECTORS:
                    await reader.send({"op": "sync", "doc": "d", "state_vector": base64.b64encode(bad).decode()})
                    refused = await reader.until("sync_reply")
                    assert (refused["op"], refused["code"], refused["doc"]) == ("error", "malformed_frame", "d"), (
                        refused
                    )
                on_loop = loop_cpu(server) - loop_before
            await writer.send({"op": "update", "doc": "d", "clock": 1, "update": base64.b64encode(updates[0]).decode()})
            assert (await writer.until("appended"))["op"] == "appended"
            assert (await reader.until("deliver"))["op"] == "deliver"
            await reader.send({"op": "sync", "doc": "d", "state_vector": base64.b64encode(b"\x00").decode()})
            assert len(text_of_update(base64.b64decode((await reader.until("sync_reply"))["update"]))) == 1
        assert server.running
    finally:
        server.stop()
    print(
        f"pings during the attack: {len(round_trips)}, slowest {max(round_trips) * 1000:.1f} ms; "
        f"event loop CPU {on_loop * 1000:.1f} ms"
    )
    # Nobody else noticed: the bystander was answered all along, and the
    # vectors were checked off the loop (its CPU over the attack and the
    # pings; a ping's wait would measure a busy machine, issue 31).
    assert len(round_trips) > 20 and on_loop < 0.1, (len(round_trips), on_loop)


@needs_ypy
async def test_a_fold_that_y_py_refuses_in_a_thread_frees_its_document_there(monkeypatch) -> None:
    """Tools fold in a worker thread (gc.collector.fold_in_thread). A y-py
    document dropped on another thread is leaked with an "unsendable" error
    (seen once in CI): the refusal must not carry it out of its thread."""
    from yrelay.yjs import crdt, engine

    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: unraisable.append(info.exc_value))
    for _ in range(3):
        with pytest.raises(crdt.InvalidUpdate, match="not a Yjs update"):
            await asyncio.to_thread(engine._coverage_by_ypy, b"\x01\x01\x05\x00\x07garbage")
    import gc

    gc.collect()
    assert unraisable == []
