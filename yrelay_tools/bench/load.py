"""One measured run: a load shape at one offered rate against one target,
driven by several generator processes (:mod:`yrelay_tools.bench.worker`).

Writers are open loop: they send on a fixed schedule whatever the server
does, so every target gets the same offered load, and a server that cannot
keep up shows it as latency and as a delivered rate below the offered one.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from yrelay_tools.bench import metrics
from yrelay_tools.bench.targets import Target
from yrelay_tools.bench.worker import ConnSpec, WorkerResult, WorkerSpec
from yrelay_tools.bench.worker import main as worker_main

#: A run keeps up when it delivered everything, at least this share of the offered rate.
SUSTAINED = 0.9
#: A figure with a generator process busier than this may be the generator's limit.
GENERATOR_BUSY = 0.8


@dataclass
class Shape:
    """Who connects to what: per generator process, its connections."""

    name: str
    workers: list[list[ConnSpec]]
    #: Offered updates per second, after rounding to whole updates per writer.
    rate: float = 0.0
    #: Clients offer permessage-deflate as Chromium does (what browsers cost a server).
    deflate: bool = True

    @property
    def connections(self) -> int:
        return sum(len(conns) for conns in self.workers)

    @property
    def updates(self) -> int:
        return sum(c.updates for conns in self.workers for c in conns)

    @property
    def sending(self) -> float:
        """Seconds from the start until the last writer's last scheduled send."""
        return max((c.updates / c.rate for conns in self.workers for c in conns if c.updates and c.rate), default=0.0)

    @property
    def expected_deliveries(self) -> int:
        return sum(c.expect for conns in self.workers for c in conns if c.measured)


def hot_document(
    rate: float, duration: float, writers: int = 2, readers: int = 50, reader_workers: int = 2, doc: str = "hot"
) -> Shape:
    """Scenario (a): one document, ``writers`` typing at ``rate`` updates/s in
    all, ``readers`` receiving everything (writers in a process of their own)."""
    per_writer = max(1, int(rate * duration / writers))
    clients = _client_ids(writers)
    writer_conns = [
        ConnSpec(
            doc,
            client=c,
            updates=per_writer,
            rate=per_writer / duration,
            expect=per_writer * (writers - 1),
            measured=False,
            phase=i / writers,
        )
        for i, c in enumerate(clients)
    ]
    total = per_writer * writers
    reader_conns = [ConnSpec(doc, expect=total) for _ in range(readers)]
    groups = [reader_conns[i::reader_workers] for i in range(reader_workers)]
    return Shape("hot document", [writer_conns, *groups], total / duration)


def many_documents(rate: float, duration: float, docs: int = 1000, workers: int = 2) -> Shape:
    """Scenario (b): ``docs`` documents with two clients each; both type (at
    ``rate`` updates/s over all documents) and each receives the other's."""
    per_client = max(1, round(rate * duration / (2 * docs)))
    clients = _client_ids(2 * docs)
    phases = random.Random(docs).random
    groups: list[list[ConnSpec]] = [[] for _ in range(workers)]
    for d in range(docs):
        for k in range(2):
            groups[(2 * d + k) % workers].append(
                ConnSpec(
                    f"doc-{d}",
                    client=clients[2 * d + k],
                    updates=per_client,
                    rate=per_client / duration,
                    expect=per_client,
                    phase=phases(),
                )
            )
    return Shape("many documents", groups, per_client * 2 * docs / duration)


def idle_connections(connections: int, docs: int = 100, workers: int = 2) -> Shape:
    """Scenario (d): connections that subscribe and then do nothing."""
    groups: list[list[ConnSpec]] = [[] for _ in range(workers)]
    for i in range(connections):
        groups[i % workers].append(ConnSpec(f"idle-{i % docs}"))
    return Shape("idle connections", groups)


def _client_ids(count: int) -> list[int]:
    return random.Random(count).sample(range(1, 2**31), count)


@dataclass
class RunResult:
    target: str
    shape: str
    rate: float
    connections: int
    updates: int
    acked: int | None  # None: the server acknowledges nothing
    acked_per_s: float | None
    expected_deliveries: int
    deliveries: int
    deliveries_per_s: float
    offered_deliveries_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    complete: bool
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per process of the target
    cpu_per_1k: float = 0.0  # server (and redis) CPU seconds per 1,000 updates
    rss_per_connection: float = 0.0  # bytes of server RSS per open connection
    server_rss: int = 0
    redis_memory_per_doc: float | None = None
    generator_busy: float = 0.0  # the busiest generator process: CPU / wall
    errors: int = 0
    note: str = ""

    @property
    def sustained(self) -> bool:
        return self.complete and self.deliveries_per_s >= SUSTAINED * self.offered_deliveries_per_s

    @property
    def generator_limited(self) -> bool:
        return self.generator_busy >= GENERATOR_BUSY

    def as_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data.update(sustained=self.sustained, generator_limited=self.generator_limited)
        return data


class Generator:
    """The generator processes of one run, connected to one target."""

    def __init__(self, target: Target, shape: Shape, drain: float):
        self.target = target
        self.shape = shape
        context = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.processes = []
        for conns in shape.workers:
            parent, child = context.Pipe()
            spec = WorkerSpec(
                target.protocol,
                target.host,
                target.port,
                conns,
                target.parallel_connects,
                drain,
                shape.deflate,
                shape.sending,
            )
            process = context.Process(target=worker_main, args=(child, spec), daemon=True)
            process.start()
            self.pipes.append(parent)
            self.processes.append(process)

    def connect(self, timeout: float = 600.0) -> None:
        """Worker by worker (each opens its connections ``parallel`` at a time)."""
        for pipe in self.pipes:
            self._expect(pipe, "prepared", timeout)
        for pipe in self.pipes:
            pipe.send(("connect", None))
            self._expect(pipe, "ready", timeout)

    def go(self, lead: float = 0.3) -> list[WorkerResult]:
        start = time.perf_counter() + lead
        for pipe in self.pipes:
            pipe.send(("go", start))
        self.start = start
        return [self._expect(pipe, "done", 3600) for pipe in self.pipes]

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(("close", None))
                if pipe.poll(20):
                    pipe.recv()
            except (OSError, EOFError):
                pass
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()

    @staticmethod
    def _expect(pipe: Connection, what: str, timeout: float) -> Any:
        if not pipe.poll(timeout):
            raise TimeoutError(f"generator process: no '{what}' after {timeout}s")
        kind, value = pipe.recv()
        if kind != what:
            raise RuntimeError(f"generator process: {kind}: {value}")
        return value


def run(target: Target, shape: Shape, drain: float = 10.0) -> RunResult:
    """Start nothing: ``target`` is running. Connect, measure, disconnect."""
    pids = target.pids()
    rss_before = metrics.rss(pids["server"])
    redis_before = metrics.redis_used_memory(target.redis_url) if target.redis_url else 0
    generator = Generator(target, shape, drain)
    try:
        generator.connect()
        server_rss = metrics.rss(pids["server"])
        # The server's validator and engine workers count as the server's CPU
        # (listed apart: server + its workers + redis in the report).
        helpers = target.helper_pids() if hasattr(target, "helper_pids") else ()
        metered: dict[str, int | tuple[int, ...]] = {"server": pids["server"]}
        metered.update({"server workers": helpers} if helpers else {})
        metered.update({name: pid for name, pid in pids.items() if name != "server"})
        meter = metrics.CpuMeter(metered)
        results = generator.go()
        cpu = meter.used()
        redis_after = metrics.redis_used_memory(target.redis_url) if target.redis_url else 0
    finally:
        generator.close()
    return summarize(target, shape, generator.start, results, cpu, server_rss, rss_before, redis_after - redis_before)


def failed_run(target: Target, shape: Shape, reason: str) -> RunResult:
    """The row of a step the server failed (a connection refused or never answered)."""
    nan = float("nan")
    return RunResult(
        target=target.name,
        shape=shape.name,
        rate=shape.rate,
        connections=shape.connections,
        updates=0,
        acked=None,
        acked_per_s=None,
        expected_deliveries=shape.expected_deliveries,
        deliveries=0,
        deliveries_per_s=0.0,
        offered_deliveries_per_s=shape.rate,
        p50_ms=nan,
        p99_ms=nan,
        max_ms=nan,
        complete=False,
        note=f"FAILED: {reason[:200]}; {target.note}",
    )


def summarize(
    target: Target,
    shape: Shape,
    start: float,
    results: list[WorkerResult],
    cpu: dict[str, float],
    server_rss: int,
    rss_before: int,
    redis_growth: int,
) -> RunResult:
    sent: dict[int, float] = {}
    arrived: dict[int, float] = {}
    for result in results:
        sent.update(result.sent)
        for key, (last, _) in result.receipts.items():
            if last > arrived.get(key, 0.0):
                arrived[key] = last
    latencies = sorted(arrived[key] - t for key, t in sent.items() if key in arrived)
    deliveries = sum(r.deliveries for r in results)
    expected = sum(r.expected_deliveries for r in results)
    last = max([0.0, *arrived.values()])
    elapsed = max(1e-9, last - start)
    updates = len(sent)
    acked = sum(r.acked for r in results) if target.protocol == "yrelay" else None
    last_ack = max(r.last_ack for r in results)
    readers_per_update = expected / updates if updates else 0
    docs = len({c.doc for conns in shape.workers for c in conns})
    return RunResult(
        target=target.name,
        shape=shape.name,
        rate=shape.rate,
        connections=shape.connections,
        updates=updates,
        acked=acked,
        acked_per_s=(acked / max(1e-9, last_ack - start)) if acked else None,
        expected_deliveries=expected,
        deliveries=deliveries,
        deliveries_per_s=deliveries / elapsed,
        offered_deliveries_per_s=shape.rate * readers_per_update,
        p50_ms=metrics.percentile(latencies, 0.5) * 1000,
        p99_ms=metrics.percentile(latencies, 0.99) * 1000,
        max_ms=(latencies[-1] * 1000) if latencies else float("nan"),
        complete=all(r.complete for r in results) and deliveries >= expected,
        cpu=cpu,
        cpu_per_1k=sum(cpu.values()) / max(1, updates) * 1000,
        rss_per_connection=(server_rss - rss_before) / max(1, shape.connections),
        server_rss=server_rss,
        redis_memory_per_doc=(redis_growth / docs) if target.redis_url else None,
        generator_busy=max(r.cpu / max(1e-9, r.wall) for r in results),
        errors=sum(r.errors for r in results),
        note=target.note,
    )
