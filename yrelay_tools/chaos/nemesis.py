"""The nemesis: a seeded schedule of faults, and the code that injects them.

The schedule is a pure function of the seed, the duration and the fault kinds
(:func:`schedule`), so a run is reproduced by its command line; what the
faults hit at run time (which updates were in flight) is not deterministic.

Every fault is bounded in time: a paused server is continued, a killed one
restarted, network conditions are cleared. Faults on the cluster (servers,
Redis) take a lock, so a failover never races a server restart; network
faults and client crashes run beside them.

``redis-kill-client-crash`` replays the order of issue 15: Redis goes down
(a client's update is refused, ``unavailable``, and waits for its resend
timer), comes back (the client's later updates go out at once), and the
client, one without persistence, is SIGKILLed as soon as one of those later
updates is answered (``appended`` by a server without causal admission,
``missing_dependency`` by one with it) while the earlier one is unacked, or
after a few seconds. The later updates must not have been acked: what they
build on was never stored.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from yrelay.gc import Collector, GcPolicy, collect_documents
from yrelay_tools.chaos.checker import connect
from yrelay_tools.chaos.clients import ClientProcess
from yrelay_tools.chaos.cluster import Cluster
from yrelay_tools.chaos.sharded import ShardedCluster

log = logging.getLogger(__name__)


class Fault(str, enum.Enum):
    SERVER_KILL = "server-kill"  # SIGKILL a server process, restart it
    SERVER_PAUSE = "server-pause"  # SIGSTOP, then SIGCONT
    REDIS_KILL = "redis-kill"  # SIGKILL redis-server, restart it from its AOF
    FAILOVER = "failover"  # promote a replica that misses the last writes
    CLIENT_CRASH = "client-crash"  # SIGKILL a client process, restart it (from its state file, if it has one)
    REDIS_KILL_CLIENT_CRASH = "redis-kill-client-crash"  # redis-kill, then SIGKILL a client without persistence
    GC = "gc"  # a GC pass at aggressive thresholds (evictions)
    NET_LATENCY = "net-latency"
    NET_BANDWIDTH = "net-bandwidth"
    NET_DROP = "net-drop"
    NET_RESET = "net-reset"
    NET_HALF_OPEN = "net-half-open"
    # On a Redis Cluster only (``yrelay chaos --cluster``):
    MASTER_KILL = "master-kill"  # SIGKILL a master; its replica takes over; the node comes back as a replica
    CLUSTER_FAILOVER = "cluster-failover"  # CLUSTER FAILOVER on a master's replica (coordinated switch)
    SLOT_MIGRATION = "slot-migration"  # a document's slot moved to another master during edits


NETWORK = [Fault.NET_LATENCY, Fault.NET_BANDWIDTH, Fault.NET_DROP, Fault.NET_RESET, Fault.NET_HALF_OPEN]
#: Faults of a Redis Cluster, and those of the one Redis they replace there
#: (its restart from an AOF and its replica promotion have no meaning on a cluster).
SHARD_FAULTS = [Fault.MASTER_KILL, Fault.CLUSTER_FAILOVER, Fault.SLOT_MIGRATION]
SINGLE_REDIS_FAULTS = [Fault.REDIS_KILL, Fault.FAILOVER, Fault.REDIS_KILL_CLIENT_CRASH]
#: Names accepted besides the fault names themselves.
GROUPS: dict[str, list[Fault]] = {"all": [f for f in Fault if f not in SHARD_FAULTS], "network": NETWORK}
#: The fault kinds of a row of the per-fault table.
CATEGORY = {fault: ("network" if fault in NETWORK else fault.value) for fault in Fault}
#: Faults on the processes under test: one at a time (they take the lock).
CLUSTER_FAULTS = {Fault.SERVER_KILL, Fault.SERVER_PAUSE, Fault.REDIS_KILL, Fault.FAILOVER, *SHARD_FAULTS}


def all_faults(cluster: bool) -> list[Fault]:
    """Every fault kind that applies to the topology."""
    excluded = SINGLE_REDIS_FAULTS if cluster else SHARD_FAULTS
    return [fault for fault in Fault if fault not in excluded]


def parse_faults(names: str, cluster: bool = False) -> list[Fault]:
    """``"all"``, ``"network,gc"``, ``"failover"`` ... into fault kinds (in
    order, once each); ``all`` means those of the topology."""
    groups = {**GROUPS, "all": all_faults(cluster)}
    faults: list[Fault] = []
    for name in filter(None, (part.strip() for part in names.split(","))):
        for fault in groups.get(name) or [Fault(name)]:
            if fault not in faults:
                faults.append(fault)
    return faults


@dataclass(frozen=True)
class Action:
    at: float  # seconds after the start of the editing phase
    fault: Fault
    target: int  # server or client index (taken modulo their number)
    seconds: float  # how long it lasts (pause, outage, condition, failover window)
    value: float = 0.0  # latency in seconds / bandwidth in bytes per second


def schedule(seed: int, duration: float, faults: list[Fault], mean_gap: float = 4.0) -> list[Action]:
    """Faults spread over ``[2, duration - 6]`` s, every kind at least once,
    the rest drawn at random; the same arguments give the same schedule."""
    rng = random.Random(seed)
    if not faults:
        return []
    window = max(duration - 8.0, 1.0)
    count = max(len(faults), int(window / mean_gap))
    kinds = list(faults) + [rng.choice(faults) for _ in range(count - len(faults))]
    rng.shuffle(kinds)
    slot = window / count
    actions = []
    for index, fault in enumerate(kinds):
        at = 2.0 + slot * index + rng.uniform(0, slot * 0.5)
        seconds, value = _shape(fault, rng)
        actions.append(Action(round(at, 3), fault, rng.randrange(1 << 16), round(seconds, 3), round(value, 3)))
    return actions


def _shape(fault: Fault, rng: random.Random) -> tuple[float, float]:
    if fault is Fault.NET_LATENCY:
        return rng.uniform(1.0, 4.0), rng.uniform(0.05, 0.4)
    if fault is Fault.NET_BANDWIDTH:
        return rng.uniform(1.0, 4.0), rng.choice([2_000, 10_000, 50_000])
    if fault is Fault.NET_HALF_OPEN:
        return rng.uniform(1.0, 5.0), 0.0
    if fault is Fault.SERVER_PAUSE:
        return rng.uniform(0.5, 4.0), 0.0
    if fault is Fault.FAILOVER:
        return rng.uniform(0.3, 1.5), 0.0  # the primary acks alone this long
    if fault in (Fault.REDIS_KILL, Fault.SERVER_KILL, Fault.CLIENT_CRASH, Fault.MASTER_KILL):
        return rng.uniform(0.2, 2.0), 0.0  # down this long
    if fault is Fault.REDIS_KILL_CLIENT_CRASH:
        # Redis (and then the client) down this long; the longest wait, once
        # Redis is back, for the client to get an answer past an unacked update.
        return rng.uniform(0.5, 2.0), rng.uniform(1.0, 3.0)
    return 0.0, 0.0


@dataclass
class Injected:
    """What one fault did, for the report."""

    action: Action
    started: float  # seconds after the start
    ended: float = 0.0
    detail: str = ""


#: Called after Redis may have lost writes: ``(label)`` -> acked updates it
#: lacks that no earlier call had found missing.
LossProbe = Callable[[str], Awaitable[int]]


@dataclass
class Nemesis:
    cluster: Cluster | ShardedCluster
    clients: list[ClientProcess]
    probe_loss: LossProbe
    #: The documents (a slot migration moves one of them).
    docs: list[str] = field(default_factory=list)
    gc_policy: GcPolicy = field(default_factory=lambda: GcPolicy(relative_ms=500, absolute_ms=2_000))
    injected: list[Injected] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._cluster_lock = asyncio.Lock()
        self._t0 = time.monotonic()
        self._running: set[asyncio.Task[None]] = set()

    def now(self) -> float:
        return time.monotonic() - self._t0

    async def run(self, actions: list[Action], t0: float) -> None:
        """Inject ``actions`` (times relative to ``t0``, a monotonic time) and
        return once every fault has ended."""
        self._t0 = t0
        for action in actions:
            delay = action.at - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self._inject(action))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        await asyncio.gather(*list(self._running))

    @property
    def last_fault_end(self) -> float:
        return max((record.ended for record in self.injected), default=0.0)

    async def _inject(self, action: Action) -> None:
        record = Injected(action, self.now())
        self.injected.append(record)
        try:
            if action.fault in CLUSTER_FAULTS:
                async with self._cluster_lock:
                    record.started = self.now()
                    record.detail = await self._cluster_fault(action)
            elif action.fault is Fault.REDIS_KILL_CLIENT_CRASH:
                record.detail = await self._outage_then_crash(action, record)
            else:
                record.detail = await self._other_fault(action)
        except Exception as exc:  # a fault that could not be injected is reported, not fatal
            log.exception("fault %s failed", action)
            record.detail = f"failed: {exc!r}"
        record.ended = self.now()
        log.info(
            "fault %s at %.1fs: %s (%.1fs)",
            action.fault.value,
            record.started,
            record.detail,
            record.ended - record.started,
        )

    async def _gc_pass(self, attempts: int = 20) -> str:
        """One pass over every document; retried while Redis is away (another
        fault may have it down), as ``yrelay gc`` would be by an operator."""
        for attempt in range(attempts):
            redis = connect(self.cluster.redis_url, self.cluster.is_cluster, socket_timeout=10)
            try:
                summary = await collect_documents(Collector(redis, self.gc_policy), None)
                return f"evicted {summary.evicted}, folded {summary.folded}, trimmed {summary.trimmed}"
            except (RedisError, OSError):
                if attempt + 1 == attempts:
                    raise
                await asyncio.sleep(0.5)
            finally:
                await redis.aclose()
        raise AssertionError("unreachable")

    def _single_redis(self, action: Action) -> Cluster:
        """The cluster of a fault on the one Redis (its process, its
        replica): ``yrelay chaos`` refuses such faults with a sharded
        cluster, so meeting one here is a bug of the schedule."""
        if not isinstance(self.cluster, Cluster):
            raise TypeError(f"{action.fault.value} needs a single Redis, not a sharded cluster")
        return self.cluster

    async def _cluster_fault(self, action: Action) -> str:
        cluster = self.cluster
        if isinstance(cluster, ShardedCluster) and action.fault in SHARD_FAULTS:
            return await self._shard_fault(cluster, action)
        index = action.target % len(cluster.servers)
        if action.fault is Fault.SERVER_KILL:
            await asyncio.to_thread(cluster.kill_server, index)
            await asyncio.sleep(action.seconds)
            await asyncio.to_thread(cluster.start_server, index)
            return f"server {index}"
        if action.fault is Fault.SERVER_PAUSE:
            cluster.pause_server(index)
            await asyncio.sleep(action.seconds)
            cluster.resume_server(index)
            return f"server {index}"
        if action.fault is Fault.REDIS_KILL:
            single = self._single_redis(action)
            await asyncio.to_thread(single.kill_redis)
            await asyncio.sleep(action.seconds)
            await asyncio.to_thread(single.start_redis)
            lost = await self.probe_loss(f"redis-kill at {action.at}s")
            return f"acked updates missing from the restarted Redis: {lost}"
        if action.fault is Fault.FAILOVER:
            single = self._single_redis(action)
            if not await asyncio.to_thread(single.wait_replica_linked):
                return "skipped: no linked replica"
            single.promote_replica()
            await asyncio.sleep(action.seconds)
            await asyncio.to_thread(single.finish_failover)
            lost = await self.probe_loss(f"failover at {action.at}s")
            await asyncio.to_thread(single.restart_servers)
            return f"acked updates missing from the promoted replica: {lost}"
        raise ValueError(action.fault)

    async def _shard_fault(self, cluster: ShardedCluster, action: Action) -> str:
        """A master killed or failed over, or a document's slot migrated;
        after a change of master, the acked updates its successor lacks."""
        if action.fault is Fault.SLOT_MIGRATION:
            doc = self.docs[action.target % len(self.docs)]
            slot, source, destination = await asyncio.to_thread(cluster.migrate_document, doc, action.target)
            return f"{doc} (slot {slot}) moved from {source} to {destination}"
        if action.fault is Fault.CLUSTER_FAILOVER:
            old, new = await asyncio.to_thread(cluster.cluster_failover, action.target)
            lost = await self.probe_loss(f"cluster-failover at {action.at}s")
            return f"master {old} -> {new}; acked updates missing from the new master: {lost}"
        old, new = await asyncio.to_thread(cluster.kill_master, action.target)
        lost = await self.probe_loss(f"master-kill at {action.at}s")
        await asyncio.sleep(action.seconds)
        await asyncio.to_thread(cluster.restart_node, old)
        return f"master {old} killed, {new} took over; acked updates missing from the new master: {lost}"

    async def _outage_then_crash(self, action: Action, record: Injected) -> str:
        """Issue 15's order; the detail says what the killed client was
        answered between Redis's return and its death (``missing_dependency``:
        later updates refused because an earlier one was not stored)."""
        ephemeral = [client for client in self.clients if not client.config.persist] or self.clients
        client = ephemeral[action.target % len(ephemeral)]
        async with self._cluster_lock:
            record.started = self.now()
            single = self._single_redis(action)
            await asyncio.to_thread(single.kill_redis)
            await asyncio.sleep(action.seconds)
            await asyncio.to_thread(single.start_redis)
            back = time.monotonic()
            refused = await _answer_past_unacked(client, action.value)
            waited = time.monotonic() - back
            await asyncio.to_thread(client.kill)
            lost = await self.probe_loss(f"redis-kill at {action.at}s")
        await asyncio.sleep(action.seconds)
        client.start()
        return (
            f"{client.name} killed {waited:.2f}s after Redis was back; since then "
            f"{refused.get('answered_past_unacked', 0)} answers past an unacked update, refused: "
            f"missing_dependency {refused.get('error:missing_dependency', 0)}, "
            f"unavailable {refused.get('error:unavailable', 0)}; acked updates missing from the restarted Redis: {lost}"
        )

    async def _other_fault(self, action: Action) -> str:
        if action.fault is Fault.GC:
            return await self._gc_pass()
        client = self.clients[action.target % len(self.clients)]
        if action.fault is Fault.CLIENT_CRASH:
            await asyncio.to_thread(client.kill)
            await asyncio.sleep(action.seconds)
            client.start()
            return client.name
        proxy = client.proxy
        if action.fault is Fault.NET_LATENCY:
            proxy.degrade(latency=action.value)
        elif action.fault is Fault.NET_BANDWIDTH:
            proxy.degrade(bandwidth=int(action.value))
        elif action.fault is Fault.NET_DROP:
            proxy.drop()
        elif action.fault is Fault.NET_RESET:
            proxy.reset()
        elif action.fault is Fault.NET_HALF_OPEN:
            proxy.half_open(action.seconds)
        await asyncio.sleep(action.seconds)
        proxy.clear()
        return client.name


async def _answer_past_unacked(client: ClientProcess, limit: float) -> dict[str, int]:
    """Wait up to ``limit`` seconds for ``client`` to be answered about an
    update while an earlier one of its document is unacked; its refusals
    and such answers meanwhile."""
    before = _refusals(client)
    since: dict[str, int] = {}
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and not since.get("answered_past_unacked"):
        await asyncio.sleep(0.02)
        since = {name: count - before[name] for name, count in _refusals(client).items()}
    return since


def _refusals(client: ClientProcess) -> dict[str, int]:
    """The client's refusals so far and its answers past an unacked update
    (from its status file: rewritten at once on the latter)."""
    counters = (client.status() or {}).get("counters", {})
    return {
        name: counters.get(name, 0)
        for name in ("error:unavailable", "error:missing_dependency", "answered_past_unacked")
    }
