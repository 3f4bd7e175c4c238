"""The per-process parts every connection shares, built once at start-up.

Every part that holds a connection, a task or a process has its stop on
one exit stack before anything connects or starts, in the order that makes
the stack's unwinding the order of a clean stop: a start-up that fails half
way (Redis unreachable, a validator that cannot start) closes what it had
opened instead of leaving tasks running and connections open.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript as Script

from yrelay.app.answer_cache import AnswerCache
from yrelay.app.core.services import AllowanceServices, HandshakeServices, ReadServices, Services, WriteServices
from yrelay.app.fanout import Fanout, Subscriber
from yrelay.app.inflight import ByteBudget
from yrelay.app.limits import Limits
from yrelay.app.metrics import Metrics, NullMetrics, ServerFigures
from yrelay.app.presence import Presence
from yrelay.app.quotas import SubjectQuotas
from yrelay.app.sessions import SessionRegistry
from yrelay.app.subscribers import SubscriptionRegistry
from yrelay.app.ticker import Ticker
from yrelay.auth import Authenticator, NoAuthenticator, Revocations, authenticator_for
from yrelay.config import Settings
from yrelay.gc import Collector, GcLoop, GcPolicy
from yrelay.observability.eventlog import EventLog, NullEventLog, process_name
from yrelay.observability.events import Events
from yrelay.reconciliation.stream_digest import StreamDigests
from yrelay.storage.append import Appender
from yrelay.storage.change_feed import announce_buckets
from yrelay.storage.client import ensure_reachable, open_redis
from yrelay.storage.embedded import check_durability
from yrelay.storage.keys import session_documents_key, session_of_documents_key
from yrelay.storage.listing import fold_unbucketed
from yrelay.storage.reads import DocumentStore
from yrelay.storage.replicas import ReplicaWait
from yrelay.storage.replies import text
from yrelay.storage.scripts import NAMES as SCRIPT_NAMES
from yrelay.tracker import AckWriter, Tracker
from yrelay.tracker.tracker import session_documents
from yrelay.transport.receiving import RECEIVING, Receiving
from yrelay.yjs.engine_pool import EnginePool
from yrelay.yjs.validator import Validator

log = logging.getLogger(__name__)

#: Redis connections of a server process's main pool (more callers wait).
REDIS_POOL_SIZE = 64


@dataclass
class ServerContext:
    settings: Settings
    redis: Redis
    store: DocumentStore
    tracker: Tracker
    ack_writer: AckWriter
    appender: Appender
    fanout: Fanout
    #: This process's subscriptions: fed by the fan-out, told of evictions by the ack writer.
    subscriptions: SubscriptionRegistry[Subscriber]
    sessions: SessionRegistry
    collector: Collector
    gc_loop: GcLoop
    digests: StreamDigests
    events: Events
    presence: Presence
    authenticator: Authenticator
    revocations: Revocations
    metrics: Metrics
    limits: Limits
    validator: Validator
    engine: EnginePool
    #: Bytes of updates between arrival and answer, all connections together.
    inflight_bytes: ByteBudget
    process_id: str = field(default_factory=process_name)
    #: Recent sync answers (answer_cache.py): one not changed is not computed again.
    answers: AnswerCache[Any] = field(default_factory=AnswerCache)
    #: Bytes of websocket messages being received by the process (receiving.py).
    receiving: Receiving = field(default=RECEIVING, repr=False)
    #: Every connection's periodic checks, on one task (ticker.py).
    ticker: Ticker = field(init=False, repr=False)
    #: What each flow of a connection uses of the above (core/services.py).
    services: Services = field(init=False, repr=False)
    #: What ``close`` unwinds (see the module doc).
    _stack: AsyncExitStack = field(default_factory=AsyncExitStack, repr=False)

    def __post_init__(self) -> None:
        self.ticker = Ticker(self.settings.resend_check_interval)
        settings, events, metrics = self.settings, self.events, self.metrics
        self.services = Services(
            settings=settings,
            limits=self.limits,
            ticker=self.ticker,
            authenticator=self.authenticator,
            events=events,
            metrics=metrics,
            presence=self.presence,
            handshake=HandshakeServices(settings, self.sessions, self.authenticator, self.revocations),
            allowance=AllowanceServices(settings, self.limits, self.authenticator, metrics),
            writes=WriteServices(settings, self.validator, self.appender, self.inflight_bytes, events, metrics),
            reads=ReadServices(
                settings,
                self.store,
                self.fanout,
                self.tracker,
                self.ack_writer,
                self.digests,
                self.engine,
                self.answers,
                events,
            ),
        )

    def scrape_figures(self) -> ServerFigures:
        """This process's state for a scrape (:class:`yrelay.app.metrics.ServerState`)."""
        subscriptions = list(self.subscriptions)
        return ServerFigures(
            documents_active=len(self.fanout.feeds),
            subscriptions_open=len(subscriptions),
            unacked_entries=sum(getattr(subscriber, "unacked", 0) for subscriber in subscriptions),
            presence_members=sum(len(members) for members in self.presence.members.values()),
            presence_updates=self.presence.updates,
            presence_frames_relayed=self.presence.relayed,
            receiving_closes=self.receiving.closed,
            receiving_bytes=self.receiving.held,
            event_log_dropped_events=self.events.log.dropped,
        )

    @classmethod
    async def open(
        cls, settings: Settings, redis_url: str, authenticator: Authenticator | None = None
    ) -> ServerContext:
        authenticator = authenticator or authenticator_for(settings)  # refuse to start unconfigured
        announce_auth(settings, authenticator)
        async with AsyncExitStack() as stack:  # unwound here if anything below fails
            ctx = await cls._assemble(stack, settings, redis_url, authenticator)
            await ensure_reachable(ctx.redis, redis_url)
            await ctx.store.load_scripts()
            await fold_unbucketed(ctx.redis)
            for warning in await check_durability(ctx.redis):
                log.warning("ACKS MAY NOT BE DURABLE: %s", warning)
            ctx.metrics.watch(ctx)
            if settings.verify_digests:
                await verify_digests(ctx.digests)
            ctx.ack_writer.start()
            ctx.appender.start()
            ctx.fanout.start()
            ctx.gc_loop.start()
            ctx.presence.start()
            ctx.limits.subjects.start()
            ctx.revocations.start()
            # The engine's workers start beside the validator's, and both are
            # up before the first client: started later, they competed with
            # the clients for the CPU (yrelay/yjs/engine_pool.py).
            ctx.engine.warm_up()
            await ctx.validator.start()
            await ctx.engine.warmed()
            ctx._stack = stack.pop_all()
        return ctx

    @classmethod
    async def _assemble(
        cls, stack: AsyncExitStack, settings: Settings, redis_url: str, authenticator: Authenticator
    ) -> ServerContext:
        """Every part, nothing started yet; each one's stop is on ``stack``
        (stopping a part that never started only closes its connections)."""
        metrics = Metrics() if settings.metrics else NullMetrics()
        # The same emit calls feed the event log and the metrics.
        events = Events(open_event_log(settings), *([metrics] if settings.metrics else []))
        stack.callback(events.stop)
        # A burst of connections needs more Redis calls at once than redis-py's
        # default pool (100 in redis-py 8) allows; wait for a connection
        # rather than fail the frame with "Too many connections".
        redis = open_redis(
            redis_url, settings.redis_cluster, pool_size=REDIS_POOL_SIZE, socket_timeout=10, health_check_interval=30
        )
        stack.push_async_callback(redis.aclose)
        store = DocumentStore(redis)
        engine = EnginePool(settings.engine_workers, settings.engine_timeout, with_ypy=settings.validate_with_ypy)
        collector = Collector(redis, GcPolicy.from_settings(settings), events=events, fold=engine.fold)
        # The registry exists before the ack writer and the fan-out that share it.
        subscriptions: SubscriptionRegistry[Subscriber] = SubscriptionRegistry()
        fanout = open_fanout(settings, redis_url, store, subscriptions)
        ctx = cls(
            settings=settings,
            redis=redis,
            store=store,
            tracker=Tracker(redis, store.scripts),
            ack_writer=AckWriter(redis, on_evicted=subscriptions.session_evicted),
            appender=Appender(
                store,
                ReplicaWait.of(settings.ack_replicas, settings.ack_replicas_timeout),
                announce=partial(announce_buckets, redis) if settings.redis_cluster else None,
                stored=fanout.stored,  # what a writer holds: checked after a failover
            ),
            fanout=fanout,
            subscriptions=subscriptions,
            sessions=SessionRegistry(redis, settings.session_ttl),
            collector=collector,
            gc_loop=GcLoop(
                collector,
                interval=settings.gc_interval,
                batch_size=settings.gc_batch_size,
                lease=settings.gc_lease,
                on_pass=metrics.gc_pass,
            ),
            digests=StreamDigests(redis, store.scripts),
            events=events,
            # Its pub/sub connection: in a cluster, to the seed node (classic
            # pub/sub reaches every node: docs/architecture.md#redis-cluster).
            presence=Presence(
                redis,
                Redis.from_url(redis_url, socket_connect_timeout=5, socket_timeout=10),
                timeout=settings.presence_timeout,
                process_id=process_name(),
                max_clients=settings.max_presence_clients_per_document,
                greeting_bytes=settings.max_presence_greeting_bytes,
            ),
            authenticator=authenticator,
            revocations=Revocations(redis, settings.revocation_refresh, leeway=settings.auth_leeway),
            metrics=metrics,
            limits=Limits(settings, SubjectQuotas(redis, store.scripts, settings)),
            validator=Validator(
                settings.validator_workers, settings.validate_timeout, with_ypy=settings.validate_with_ypy
            ),
            engine=engine,
            inflight_bytes=ByteBudget(settings.max_inflight_bytes),
        )
        # Unwound last to first: the order of a clean stop.
        for stop in (
            ctx.engine.stop,
            ctx.validator.stop,
            ctx.ack_writer.stop,
            ctx.appender.stop,
            ctx.fanout.stop,
            ctx.limits.subjects.stop,
            ctx.presence.stop,
            ctx.gc_loop.stop,
            ctx.revocations.stop,
        ):
            stack.push_async_callback(stop)
        return ctx

    def scripts(self) -> list[Script]:
        """Every Lua script the server calls."""
        return [getattr(self.store.scripts, name) for name in SCRIPT_NAMES] + list(self.presence.scripts)

    async def close(self) -> None:
        """Stop every service and close every connection (idempotent)."""
        self.ticker.close()
        await self._stack.aclose()


def open_fanout(
    settings: Settings, redis_url: str, store: DocumentStore, subscriptions: SubscriptionRegistry[Subscriber]
) -> Fanout:
    """The fan-out, on a client of its own: one Redis, a single connection
    blocking in XREAD; a cluster, a cluster client (redis-py closes every
    connection of a cluster client when one node fails, and the appender's
    should not go down with the fan-out's blocked reads)."""
    options = dict(block_ms=settings.block_ms, count=settings.page_size, max_bytes=settings.max_page_bytes)
    if settings.redis_cluster:
        return Fanout(open_redis(redis_url, True, socket_timeout=10), store, subscriptions, **options)
    reader = Redis.from_url(redis_url, single_connection_client=True, socket_timeout=None)
    return Fanout(reader, store, subscriptions, **options)


def announce_auth(settings: Settings, authenticator: Authenticator) -> None:
    """A server without authentication must never pass unnoticed."""
    if isinstance(authenticator, NoAuthenticator):
        for line in (
            "*" * 72,
            "AUTHENTICATION IS OFF (--insecure-no-auth): anyone who reaches this server",
            "can read and write every document. For development only.",
            "*" * 72,
        ):
            log.warning(line)


def open_event_log(settings: Settings) -> EventLog:
    if not settings.event_log:
        return NullEventLog()
    return EventLog(
        settings.data_dir / "events",
        max_bytes=settings.event_log_max_bytes,
        max_age=settings.event_log_max_age,
        capacity=settings.event_log_buffer,
        subjects=settings.event_log_subject,
    ).start()


async def verify_digests(digests: StreamDigests) -> None:
    """The start-up check: every stored digest against what it sums up, the
    documents' against their streams, the sessions' against their sets."""
    log.info("verifying the drift digests of every document and session")
    wrong = len(await digests.recompute_all(fix=True))
    async for key in digests.redis.scan_iter(match=session_documents_key("*"), count=1000):
        session = session_of_documents_key(text(key))
        stored, actual = await session_documents(digests.redis, session, digests.scripts).recompute(fix=True)
        if stored != actual:
            log.warning(
                "subscription-set digest of session %s was wrong (stored %s, actual %s); fixed",
                session,
                stored,
                actual,
                extra={"session": session},
            )
            wrong += 1
    if wrong:
        log.warning("drift digests: %d wrong, all fixed", wrong)
    else:
        log.info("drift digests: all correct")
