"""One chaos run, start to finish (what ``yrelay chaos`` and tests/test_chaos.py call).

1. Start the cluster (K servers, redis-server with AOF, a replica) and N
   client processes (some without persistence: a killed one comes back as
   a new client), each behind its own fault proxy; wait until all are
   subscribed to the M documents.
2. Let them edit for ``duration`` seconds while the nemesis injects its
   seeded schedule.
3. Faults have stopped: wait until every client is connected, has nothing
   unacked and holds the same content as the server (or until nothing has
   changed for ``quiet`` seconds, or ``settle_timeout``).
4. Last aggressive GC passes, until every stream has folded into its
   snapshot (or a few seconds passed); the clients write their final
   documents and exit, and :func:`yrelay_tools.chaos.checker.check_run` compares
   everything, stuck and unfolded entries included.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from yrelay.gc import Collector, collect_documents
from yrelay.yjs import crdt
from yrelay_tools.chaos.checker import (
    DeliveryFigures,
    StreamState,
    UpdateKey,
    acked_updates,
    check_run,
    connect,
    not_stored,
    server_documents,
    server_event_counts,
    stored_updates,
    stream_states,
)
from yrelay_tools.chaos.clients import ClientProcess
from yrelay_tools.chaos.cluster import Cluster, ClusterConfig
from yrelay_tools.chaos.nemesis import Fault, Nemesis, all_faults, schedule
from yrelay_tools.chaos.proxy import FaultProxy
from yrelay_tools.chaos.report import RunReport
from yrelay_tools.chaos.sharded import ShardedCluster
from yrelay_tools.chaos.workload import WorkloadConfig, write_atomically
from yrelay_tools.testing.checker import DeliveryViolation

log = logging.getLogger(__name__)

#: Server settings of a chaos run: quick resends, GC every second with a
#: two-second eviction threshold (sessions behind a fault get evicted). The
#: suite is about delivery: its clients carry no token, so authentication is off.
CHAOS_SERVER_ENV = {
    "YRELAY_INSECURE_NO_AUTH": "1",
    "YRELAY_RESEND_AFTER": "1",
    "YRELAY_RESEND_CHECK_INTERVAL": "0.5",
    "YRELAY_GC_INTERVAL": "1",
    "YRELAY_GC_RELATIVE_DELTA": "2",
    "YRELAY_GC_ABSOLUTE_DELTA": "6",
    "YRELAY_GC_LEASE": "5",
}


@dataclass(frozen=True)
class ChaosConfig:
    seed: int = 1
    duration: float = 60.0
    clients: int = 6
    docs: int = 3
    servers: int = 3
    #: None: every fault of the topology (:func:`all_faults`).
    faults: tuple[Fault, ...] | None = None
    fsync: str = "always"
    replica: bool = True
    #: Mean seconds between two faults.
    mean_gap: float = 4.0
    #: Mean seconds between two edits of one client.
    edit_interval: float = 0.15
    #: Clients without persistence (the last ones); None: half of them.
    ephemeral_clients: int | None = None
    settle_timeout: float = 240.0
    #: Stop waiting for convergence when nothing changed for this long.
    quiet: float = 30.0
    #: ``python -m`` module of the servers: a deliberately broken build in tests.
    server_module: str = "yrelay"
    server_env: dict[str, str] = field(default_factory=lambda: dict(CHAOS_SERVER_ENV))
    #: A Redis Cluster of 3 masters with a replica each instead of one Redis
    #: (``--cluster``); ``fsync`` and ``replica`` then do not apply.
    cluster: bool = False
    #: The servers' ``ack_replicas``: 1 answers ``appended`` once a replica has it.
    ack_replicas: int = 0

    def __post_init__(self) -> None:
        if self.faults is None:
            object.__setattr__(self, "faults", tuple(all_faults(self.cluster)))
        if self.ack_replicas:
            object.__setattr__(self, "server_env", {**self.server_env, "YRELAY_ACK_REPLICAS": str(self.ack_replicas)})
        if self.ephemeral_clients is None:
            object.__setattr__(self, "ephemeral_clients", self.clients // 2)
        if not 0 <= self.ephemeral_clients <= self.clients:  # type: ignore[operator]
            raise ValueError(f"ephemeral_clients must be between 0 and {self.clients}")

    def persists(self, index: int) -> bool:
        """Whether client ``index`` keeps a state file (the last ones do not)."""
        return index < self.clients - (self.ephemeral_clients or 0)

    def command(self) -> str:
        """The ``yrelay chaos`` command line that reproduces this run."""
        parts = [
            "yrelay",
            "chaos",
            "--seed",
            str(self.seed),
            "--duration",
            f"{self.duration:g}",
            "--clients",
            str(self.clients),
            "--ephemeral-clients",
            str(self.ephemeral_clients),
            "--docs",
            str(self.docs),
            "--servers",
            str(self.servers),
            "--faults",
            "all"
            if set(self.faults or ()) == set(all_faults(self.cluster))
            else ",".join(fault.value for fault in self.faults or ()),
            "--mean-gap",
            f"{self.mean_gap:g}",
            "--edit-interval",
            f"{self.edit_interval:g}",
        ]
        if self.cluster:
            parts += ["--cluster", "--ack-replicas", str(self.ack_replicas)]
        else:
            parts += ["--fsync", self.fsync] + ([] if self.replica else ["--no-replica"])
        return shlex.join(parts)


class ChaosRun:
    def __init__(self, config: ChaosConfig, root: Path):
        self.config = config
        self.root = root
        if Fault.FAILOVER in (config.faults or ()) and not config.replica:
            raise ValueError("the failover fault needs a replica")
        processes = ClusterConfig(
            servers=config.servers,
            fsync=config.fsync,
            replica=config.replica,
            server_env=config.server_env,
            server_module=config.server_module,
        )
        self.cluster = ShardedCluster(root, processes) if config.cluster else Cluster(root, processes)
        self.docs = [f"doc-{index}" for index in range(config.docs)]
        self.clients: list[ClientProcess] = []
        self.proxies: list[FaultProxy] = []
        self.lost_from_redis: set[UpdateKey] = set()
        self.nemesis = Nemesis(self.cluster, self.clients, self.probe_loss, docs=self.docs)

    async def run(self) -> RunReport:
        started = time.monotonic()
        try:
            await asyncio.to_thread(self.cluster.start)
            await self._start_clients()
            t0 = time.monotonic()
            write_atomically(self.root / "window.json", {"until": time.time() + self.config.duration})
            actions = schedule(
                self.config.seed, self.config.duration, list(self.config.faults or ()), self.config.mean_gap
            )
            await self.nemesis.run(actions, t0)
            await asyncio.sleep(max(0.0, t0 + self.config.duration - time.monotonic()))
            converged_at = await self._settle(t0)
            before_gc = await server_documents(self.cluster.redis_url, self.docs, self.cluster.is_cluster)
            streams = await self._final_gc()
            return await self._check(started, converged_at, before_gc, streams)
        finally:
            for client in self.clients:
                client.finish(timeout=5)
            for proxy in self.proxies:
                await proxy.stop()
            await asyncio.to_thread(self.cluster.stop)

    async def _start_clients(self) -> None:
        for index in range(self.config.clients):
            name = f"client-{index}"
            proxy = await FaultProxy(self.cluster.server_ports, name).start()
            config = WorkloadConfig(
                name,
                proxy.ws_url,
                self.docs,
                str(self.root / "clients" / name),
                self.config.seed,
                str(self.root / "window.json"),
                self.config.edit_interval,
                persist=self.config.persists(index),
            )
            client = ClientProcess(config, proxy)
            client.start()
            self.proxies.append(proxy)
            self.clients.append(client)
        deadline = time.monotonic() + 120
        while not all((client.status() or {}).get("ready") for client in self.clients):
            if time.monotonic() > deadline:
                raise TimeoutError("clients did not subscribe within 120 s")
            await asyncio.sleep(0.1)

    async def probe_loss(self, label: str) -> int:
        """Acked updates (recorded so far) that the current Redis does not
        store and that no earlier probe had found missing (an earlier
        failover's losses that clients have not given back yet are not
        this fault's). The reading and decoding run in a thread: the proxies
        keep going."""
        by_doc = await asyncio.to_thread(lambda: acked_updates(r for c in self.clients for r in c.acked()))
        stored = await stored_updates(self.cluster.redis_url, by_doc, self.cluster.is_cluster)

        def missing() -> set[UpdateKey]:
            return set().union(*(not_stored(stored[doc], updates) for doc, updates in by_doc.items()))

        now = await asyncio.to_thread(missing)
        new = now - self.lost_from_redis
        self.lost_from_redis |= now
        log.info(
            "%s: %d acked updates missing from Redis (%d lost earlier, not given back yet)",
            label,
            len(new),
            len(now) - len(new),
        )
        return len(new)

    async def _settle(self, t0: float) -> float | None:
        """Seconds after ``t0`` when everyone held the same content, or None."""
        for client in self.clients:  # a client crashed at the very end comes back too
            if not client.running:
                client.start()
        deadline = time.monotonic() + self.config.settle_timeout
        last_change, last_seen = time.monotonic(), None
        while time.monotonic() < deadline:
            seen, converged = await self._observe()
            if converged:
                return time.monotonic() - t0
            if seen != last_seen:
                last_seen, last_change = seen, time.monotonic()
            elif time.monotonic() - last_change > self.config.quiet:
                log.warning("no progress for %.0f s: giving up waiting for convergence", self.config.quiet)
                return None
            await asyncio.sleep(0.25)
        return None

    async def _observe(self) -> tuple[object, bool]:
        statuses = [client.status() or {} for client in self.clients]
        try:
            server = await server_documents(self.cluster.redis_url, self.docs, self.cluster.is_cluster)
        except Exception as exc:  # noqa: BLE001 - any failure to read them (Redis coming back) is 'not settled yet': _settle retries until its deadline
            return repr(exc), False
        server_sha = {doc: hashlib.sha256(crdt.text_of(ydoc).encode()).hexdigest() for doc, ydoc in server.items()}
        seen = (server_sha, [(s.get("pending"), s.get("connected"), s.get("docs")) for s in statuses])
        converged = all(
            status.get("connected")
            and status.get("pending") == 0
            and not status.get("editing")
            and all((status.get("docs") or {}).get(doc, {}).get("sha") == sha for doc, sha in server_sha.items())
            for status in statuses
        )
        return seen, converged

    async def _final_gc(self, attempts: int = 20) -> list[StreamState]:
        """GC passes until every stream has folded into its snapshot (the
        clients' last acks may still be on their way), at most ``attempts``
        of them half a second apart; the storage after the last one."""
        redis = connect(self.cluster.redis_url, self.cluster.is_cluster, socket_timeout=30)
        try:
            for _ in range(attempts):
                summary = await collect_documents(Collector(redis, self.nemesis.gc_policy), self.docs)
                if all(report.settled for report in summary.reports):
                    break
                await asyncio.sleep(0.5)
        finally:
            await redis.aclose()
        streams = await stream_states(self.cluster.redis_url, self.docs, self.cluster.is_cluster)
        log.info("after the last GC pass: %s", [(s.doc, s.length, s.blocked_at, len(s.stuck)) for s in streams])
        return streams

    async def _check(
        self, started: float, converged_at: float | None, before_gc: dict[str, crdt.Doc], streams: list[StreamState]
    ) -> RunReport:
        for client in self.clients:
            await asyncio.to_thread(client.finish)
        replicas: dict[str, dict[str, crdt.Doc]] = {}
        counters: dict[str, int] = {"crashes": 0, "ephemeral_crashes": 0}
        silent = []
        for client in self.clients:
            try:
                final = client.final()
            except (FileNotFoundError, ValueError):
                silent.append(client.name)  # it hung or died at the end: a failed run, not a crashed harness
                continue
            replicas[client.name] = {doc: _load(state) for doc, state in final["docs"].items()}
            for key, value in final["counters"].items():
                counters[key] = counters.get(key, 0) + value
            counters["crashes"] += client.crashes
            counters["ephemeral_crashes"] += 0 if client.config.persist else client.crashes
        replicas["server"] = before_gc
        replicas["server after a last GC"] = await server_documents(
            self.cluster.redis_url, self.docs, self.cluster.is_cluster
        )
        records = [record for client in self.clients for record in client.acked()]
        violation = None
        try:
            figures = check_run(records, replicas, self.lost_from_redis, streams)
        except DeliveryViolation as error:
            figures = getattr(error, "figures", DeliveryFigures())
            violation = str(error)
        if silent:
            violation = "; ".join(filter(None, [f"no final state from {', '.join(silent)}", violation]))
        last_fault = self.nemesis.last_fault_end
        report = RunReport(
            command=self.config.command(),
            config={**asdict(self.config), "faults": [fault.value for fault in self.config.faults or ()]},
            injected=self.nemesis.injected,
            delivery=figures,
            clients=counters,
            server=dict(server_event_counts(self.root)),
            converged=converged_at is not None,
            converge_after_last_fault=None if converged_at is None else converged_at - last_fault,
            converge_after_edits=None if converged_at is None else converged_at - self.config.duration,
            seconds=time.monotonic() - started,
            violation=violation,
        )
        (self.root / "report.json").write_text(report.to_json())
        (self.root / "report.md").write_text(report.to_markdown() + "\n")
        return report


def _load(state_b64: str) -> crdt.Doc:
    doc = crdt.new_doc()
    crdt.apply_update(doc, base64.b64decode(state_b64))
    return doc


async def run_chaos(config: ChaosConfig, root: Path) -> RunReport:
    """Run once under ``root`` (logs, data, report.json / report.md stay there)."""
    root.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - before the run starts anything in this loop
    handler = logging.FileHandler(root / "harness.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("yrelay")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        return await ChaosRun(config, root).run()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()
