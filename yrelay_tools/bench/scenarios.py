"""The four scenarios of issue 9, each against every target in one run.

(a) ``hot``: one document, 2 writers, 50 readers; a ladder of offered rates
    per target, each step on a freshly started server, until it falls behind.
(b) ``many``: 1,000 documents with 2 clients each; the same ladder, and the
    pipelined XADD ceiling of the storage path measured in the same run.
(c) ``catchup``: a client reconnecting 100,000 entries behind (yrelay's
    catch-up from the stream) versus a full state resync (the server folds
    the document and sends it whole); time and the server's peak memory.
(d) ``idle``: 10,000 idle connections; server RSS per connection.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from yrelay import protocol
from yrelay.storage.append import Appender, needs_or_nothing
from yrelay.storage.reads import DocumentStore
from yrelay_tools.bench import ceilings, load, metrics
from yrelay_tools.bench.drivers import _dumps, _loads
from yrelay_tools.bench.edits import writer_edits
from yrelay_tools.bench.load import RunResult
from yrelay_tools.bench.targets import Target, YrelayTarget, make_target
from yrelay_tools.bench.wsclient import WsClient

Progress = Callable[[str], None]


@dataclass
class LadderResult:
    scenario: str
    runs: list[RunResult] = field(default_factory=list)
    ceilings: dict[str, float] = field(default_factory=dict)


def ladder(
    scenario: str,
    targets: Iterable[str],
    rates: list[float],
    shape: Callable[[float], load.Shape],
    work_dir: Path,
    progress: Progress,
    drain: float = 10.0,
    deflate: bool = True,
) -> LadderResult:
    """Every target through ``rates`` (ascending), a fresh server per step,
    stopping after the first rate it does not keep up with. ``deflate``:
    clients offer permessage-deflate as Chromium does."""
    result = LadderResult(scenario)
    for key in targets:
        for rate in rates:
            target = make_target(key, work_dir)
            target.start()
            try:
                run = load.run(target, replace(shape(rate), deflate=deflate), drain)
            except (RuntimeError, TimeoutError) as exc:  # the server failed the load: a row that says so
                run = load.failed_run(target, shape(rate), str(exc))
            finally:
                target.stop()
            result.runs.append(run)
            progress(
                f"{scenario}: {run.target} at {run.rate:,.0f} updates/s: {run.deliveries_per_s:,.0f} "
                f"deliveries/s, p99 {run.p99_ms:,.1f} ms" + ("" if run.sustained else " (fell behind)")
            )
            if not run.sustained:
                break
    return result


def hot(
    targets: Iterable[str],
    rates: list[float],
    duration: float,
    work_dir: Path,
    progress: Progress,
    readers: int = 50,
    writers: int = 2,
    deflate: bool = True,
) -> LadderResult:
    return ladder(
        "hot",
        targets,
        rates,
        lambda rate: load.hot_document(rate, duration, writers=writers, readers=readers),
        work_dir,
        progress,
        deflate=deflate,
    )


def many(
    targets: Iterable[str],
    rates: list[float],
    duration: float,
    work_dir: Path,
    progress: Progress,
    docs: int = 1000,
    deflate: bool = True,
) -> LadderResult:
    result = ladder(
        "many",
        targets,
        rates,
        lambda rate: load.many_documents(rate, duration, docs=docs),
        work_dir,
        progress,
        deflate=deflate,
    )
    result.ceilings["pipelined XADD"] = ceilings.xadd_ceiling(streams=docs)
    progress(f"many: pipelined XADD ceiling {result.ceilings['pipelined XADD']:,.0f}/s")
    return result


# ------------------------------------------------------------------ idle


@dataclass
class IdleResult:
    target: str
    connections: int
    rss_before: int
    rss_after: int
    connect_seconds: float
    note: str

    @property
    def per_connection(self) -> float:
        return (self.rss_after - self.rss_before) / max(1, self.connections)


def idle(
    targets: Iterable[str], connections: int, work_dir: Path, progress: Progress, docs: int = 100, deflate: bool = True
) -> list[IdleResult]:
    results = []
    for key in targets:
        target = make_target(key, work_dir)
        target.start()
        try:
            pid = target.pids()["server"]
            time.sleep(0.5)
            before = metrics.rss(pid)
            started = time.perf_counter()
            shape = replace(load.idle_connections(connections, docs), deflate=deflate)
            generator = load.Generator(target, shape, drain=0)
            note = target.note
            try:
                generator.connect()
                time.sleep(1.0)
            except (RuntimeError, TimeoutError) as exc:
                note = f"FAILED to open every connection: {str(exc)[:200]}; {note}"
            finally:
                connect_seconds = time.perf_counter() - started
                after = metrics.rss(pid)
                generator.close()
        finally:
            target.stop()
        result = IdleResult(target.name, connections, before, after, connect_seconds, note)
        progress(f"idle: {result.target}: {result.per_connection / 1024:,.1f} kB per connection")
        results.append(result)
    return results


# ------------------------------------------------------------------ catch-up


@dataclass
class CatchupResult:
    server: str
    path: str
    entries: int
    seconds: float
    peak_rss_growth: int  # server peak RSS during the path minus RSS before it
    server_rss_before: int
    frames: int
    note: str = ""


class _Peer:
    """A yrelay connection for the catch-up scenario: frames into a queue."""

    def __init__(self) -> None:
        self.frames: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.ws: WsClient | None = None

    async def open(self, host: str, port: int, session: str | None = None) -> str:
        self.ws = await WsClient.connect(host, port, "/ws", lambda _, data: self.frames.put_nowait(_loads(data)))
        self.send({"op": "hello", "protocol": protocol.PROTOCOL_VERSION, "session": session})
        welcome = await self.expect("welcome")
        return str(welcome["session"])

    def send(self, frame: dict[str, Any]) -> None:
        assert self.ws is not None
        self.ws.send_text(_dumps(frame))

    async def expect(self, op: str, timeout: float = 120.0) -> dict[str, Any]:
        while True:
            frame = await asyncio.wait_for(self.frames.get(), timeout)
            if frame["op"] == op:
                return frame
            if frame["op"] == "error":
                raise RuntimeError(f"server error: {frame}")


async def _append_all(redis_url: str, doc: str, updates: list[bytes]) -> None:
    from redis.asyncio import Redis

    redis = Redis.from_url(redis_url)
    store = DocumentStore(redis)
    await store.load_scripts()
    appender = Appender(store)
    appender.start()
    try:
        for offset in range(0, len(updates), 5000):
            await asyncio.gather(
                *(
                    appender.submit(doc, "bench-writer", offset + i + 1, update, needs_or_nothing(update))
                    for i, update in enumerate(updates[offset : offset + 5000])
                )
            )
    finally:
        await appender.stop()
        await redis.aclose()


async def _catchup(target: YrelayTarget, entries: int, progress: Progress) -> list[CatchupResult]:
    doc = "behind"
    pid = target.pids()["server"]
    reader = _Peer()
    session = await reader.open(target.host, target.port)
    reader.send({"op": "subscribe", "doc": doc})
    held = (await reader.expect("subscribed"))["offset"]
    reader.ws.close()  # type: ignore[union-attr]
    updates = writer_edits(4242, entries)
    started = time.perf_counter()
    await _append_all(target.redis_url or "", doc, updates)
    progress(f"catchup: {entries:,} entries appended in {time.perf_counter() - started:.1f} s")
    await asyncio.sleep(1.0)
    results = []

    # The stream path: resume the session from the offset it held.
    before = metrics.rss(pid)
    metrics.reset_peak(pid)
    peer = _Peer()
    await peer.open(target.host, target.port, session)
    started, client_cpu = time.perf_counter(), time.process_time()
    peer.send({"op": "subscribe", "doc": doc, "offset": held})
    await peer.expect("subscribed")
    received = frames = 0
    while received < entries:
        frame = await peer.expect("deliver")
        frames += 1
        received += len(frame["entries"])
        for entry in frame["entries"]:
            base64.b64decode(entry["update"])
        peer.send({"op": "ack", "doc": doc, "offset": frame["entries"][-1]["id"]})
    seconds = time.perf_counter() - started
    note = f"the reading client's CPU: {time.process_time() - client_cpu:.2f} s"
    results.append(
        CatchupResult(
            target.name,
            "catch-up from the stream (resume at the held offset)",
            received,
            seconds,
            metrics.peak_rss(pid) - before,
            before,
            frames,
            note,
        )
    )
    progress(f"catchup: {target.name}: stream catch-up {seconds:.2f} s")
    peer.ws.close()  # type: ignore[union-attr]
    await asyncio.sleep(1.0)

    # Full state resync: the client holds nothing; the server folds snapshot +
    # stream into a document and sends it whole (what a resync costs).
    before = metrics.rss(pid)
    metrics.reset_peak(pid)
    peer = _Peer()
    await peer.open(target.host, target.port)
    last = await _last_id(target.redis_url or "", doc)
    peer.send({"op": "subscribe", "doc": doc, "offset": last})
    await peer.expect("subscribed")
    started = time.perf_counter()
    peer.send({"op": "sync", "doc": doc, "state_vector": base64.b64encode(b"\x00").decode()})
    frames = size = 0
    while True:
        frame = await peer.expect("sync_reply")
        frames += 1
        size += len(base64.b64decode(frame["update"]))
        if frame["part"] == frame["parts"] - 1:
            break
    seconds = time.perf_counter() - started
    results.append(
        CatchupResult(
            target.name,
            "full state resync (sync with an empty state vector)",
            entries,
            seconds,
            metrics.peak_rss(pid) - before,
            before,
            frames,
            f"{size:,} bytes of state",
        )
    )
    progress(f"catchup: {target.name}: full state resync {seconds:.2f} s")
    peer.ws.close()  # type: ignore[union-attr]
    return results


async def _last_id(redis_url: str, doc: str) -> str:
    from redis.asyncio import Redis

    redis = Redis.from_url(redis_url)
    try:
        return str(await DocumentStore(redis).last_id(doc))
    finally:
        await redis.aclose()


def catchup(targets: Iterable[str], entries: int, work_dir: Path, progress: Progress) -> list[CatchupResult]:
    """yrelay builds only (the references keep no stream to catch up from);
    GC is off so no pass folds the stream while it is measured."""
    results = []
    for key in targets:
        if not key.startswith("yrelay"):
            continue
        target = make_target(key, work_dir)
        assert isinstance(target, YrelayTarget)
        target.env["YRELAY_GC_INTERVAL"] = "0"
        target.start()
        try:
            results.extend(asyncio.run(_catchup(target, entries, progress)))
        finally:
            target.stop()
    return results


__all__ = ["CatchupResult", "IdleResult", "LadderResult", "Target", "catchup", "hot", "idle", "ladder", "many"]
