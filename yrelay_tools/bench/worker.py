"""One load-generator process: its connections, its writers' schedule, and
what its readers received. The parent (:mod:`yrelay_tools.bench.load`) starts
several, so the generator is never one busy Python process.

Talks to the parent over a pipe: ``prepared`` once its edits are made;
``connect`` (one worker at a time), answered ``ready`` once every connection
is open (opened ``parallel`` at a time); then ``go`` with a start time on the shared
monotonic clock (``time.perf_counter`` is CLOCK_MONOTONIC on Linux, the same
in every process), then ``done`` with the results, then ``close``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from yrelay_tools.bench.drivers import DRIVERS, Driver, Receipts
from yrelay_tools.bench.edits import update_key, writer_edits

#: Writers send what their schedule says every tick.
TICK = 0.002
#: How often a worker notes its own CPU time (to tell when it was the bottleneck).
SAMPLE = 0.1


@dataclass
class ConnSpec:
    doc: str
    #: Yjs client id of this connection's writer (None: it only reads).
    client: int | None = None
    #: Updates it writes, and at what rate (per second).
    updates: int = 0
    rate: float = 0.0
    #: Updates of others it must receive; measured unless ``measured`` is False.
    expect: int = 0
    measured: bool = True
    #: Where in its first period a writer starts (0..1), so writers do not send in step.
    phase: float = 0.0


@dataclass
class WorkerSpec:
    protocol: str
    host: str
    port: int
    conns: list[ConnSpec]
    parallel: int = 16
    drain: float = 10.0
    #: Offer permessage-deflate as Chromium does.
    deflate: bool = True
    #: Seconds the shape's writers send for (in every process): a worker of
    #: readers only waits ``drain`` seconds after that, not after its own
    #: (empty) schedule, or the last updates would miss its deadline.
    sending: float = 0.0


@dataclass
class WorkerResult:
    sent: dict[int, float] = field(default_factory=dict)  # update key -> send time
    receipts: dict[int, list[float]] = field(default_factory=dict)  # key -> [last arrival, readers]
    deliveries: int = 0
    expected_deliveries: int = 0
    acked: int = 0
    last_ack: float = 0.0
    errors: int = 0
    cpu: float = 0.0  # this process's CPU seconds from go to done
    wall: float = 0.0
    complete: bool = True


class Worker:
    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.receipts = Receipts()
        driver = DRIVERS[spec.protocol]
        self.drivers: list[Driver] = [
            driver(c.doc, self.receipts if c.measured else None, c.client, c.expect) for c in spec.conns
        ]
        for each in self.drivers:
            each.deflate = spec.deflate
        self.messages: list[list[bytes | str]] = []
        self.keys: list[list[int]] = []

    def prepare(self) -> None:
        for conn, driver in zip(self.spec.conns, self.drivers, strict=True):
            updates = writer_edits(conn.client, conn.updates) if conn.client is not None and conn.updates else []
            self.keys.append([update_key(u) for u in updates])  # type: ignore[misc]
            self.messages.append([driver.encode_update(clock + 1, u) for clock, u in enumerate(updates)])

    async def connect(self) -> None:
        gate = asyncio.Semaphore(max(1, self.spec.parallel))

        async def one(driver: Driver) -> None:
            async with gate:
                await driver.open(self.spec.host, self.spec.port)

        await asyncio.gather(*(one(driver) for driver in self.drivers))

    async def run(self, start: float) -> WorkerResult:
        result = WorkerResult()
        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        samples: list[tuple[float, float]] = []
        sampler = asyncio.create_task(_sample_cpu(samples))
        await self._write(start, result)
        deadline = max(time.perf_counter(), start + self.spec.sending) + self.spec.drain
        for driver in self.drivers:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                result.complete = False
                break
            try:
                await asyncio.wait_for(driver.complete.wait(), remaining)
            except TimeoutError:
                result.complete = False
        # Acks are counted by each driver's reader: no event to await for "all of them"; a bounded poll.
        while self._unacked() and time.perf_counter() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        sampler.cancel()
        # Busy while there was work: from the start to the last thing that arrived.
        end = max(
            self.receipts.last,
            max((d.last_ack for d in self.drivers), default=0.0),
            max(result.sent.values(), default=start),
        )
        active = [(t, cpu) for t, cpu in samples if t <= end + SAMPLE] or samples[:2]
        result.wall = max(1e-9, active[-1][0] - samples[0][0]) if len(active) > 1 else 1e-9
        result.cpu = active[-1][1] - samples[0][1] if len(active) > 1 else 0.0
        result.receipts = self.receipts.by_key
        result.deliveries = self.receipts.deliveries
        result.expected_deliveries = sum(c.expect for c in self.spec.conns if c.measured)
        result.acked = sum(driver.acked for driver in self.drivers)
        result.last_ack = max((driver.last_ack for driver in self.drivers), default=0.0)
        result.errors = sum(driver.errors for driver in self.drivers)
        return result

    def _unacked(self) -> bool:
        if self.spec.protocol != "yrelay":
            return False  # at-most-once servers acknowledge nothing
        return any(driver.acked < len(messages) for driver, messages in zip(self.drivers, self.messages, strict=True))

    async def _write(self, start: float, result: WorkerResult) -> None:
        writers = [
            (driver, conn.rate, conn.phase, messages, keys)
            for driver, conn, messages, keys in zip(
                self.drivers, self.spec.conns, self.messages, self.keys, strict=True
            )
            if messages
        ]
        positions = [0] * len(writers)
        sent = result.sent
        while writers and any(pos < len(w[3]) for pos, w in zip(positions, writers, strict=True)):
            now = time.perf_counter()
            for index, (driver, rate, phase, messages, keys) in enumerate(writers):
                due = min(len(messages), int((now - start) * rate + 1 - phase))
                pos = positions[index]
                while pos < due:
                    driver.send(messages[pos])
                    sent[keys[pos]] = time.perf_counter()
                    pos += 1
                positions[index] = pos
            await asyncio.sleep(TICK)

    def close(self) -> None:
        for driver in self.drivers:
            driver.close()


async def _sample_cpu(samples: list[tuple[float, float]]) -> None:
    while True:
        samples.append((time.perf_counter(), time.process_time()))
        await asyncio.sleep(SAMPLE)


def main(pipe: Connection, spec: WorkerSpec) -> None:
    """Entry point of a worker process."""
    runner: Callable[[Coroutine[Any, Any, None]], None]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    runner(_serve(pipe, spec))


async def _serve(pipe: Connection, spec: WorkerSpec) -> None:
    loop = asyncio.get_running_loop()
    worker = Worker(spec)
    worker.prepare()
    pipe.send(("prepared", None))
    while True:
        command, argument = await loop.run_in_executor(None, pipe.recv)
        if command == "connect":
            try:
                await worker.connect()
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                pipe.send(("failed", repr(exc)))
                return
            pipe.send(("ready", None))
        elif command == "go":
            pipe.send(("done", await worker.run(argument)))
        elif command == "close":
            worker.close()
            await asyncio.sleep(0.05)
            pipe.send(("closed", None))
            return
