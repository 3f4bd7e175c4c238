"""What the connection core is given: for each flow, the process's services
that flow uses, and nothing else.

Why not one context object: a flow handed the whole process (its 22 parts)
can reach any of them, so what it depends on is found only by reading every
line of it, and a test of one decision must build the whole process. Here
the wiring says it: the handshake cannot append, the write path cannot read
a stream, a subscription cannot open a session. Each bundle is built once
per process (by :class:`yrelay.app.context.ServerContext`) and shared by
every connection; a connection and each of its flows hold one
reference to theirs, as they held the context before, so a connection costs
no more memory.

The settings are passed whole: they are one immutable value, configuration
rather than a service.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from yrelay.app.answer_cache import AnswerCache
    from yrelay.app.fanout import Fanout
    from yrelay.app.inflight import ByteBudget
    from yrelay.app.limits import Limits
    from yrelay.app.metrics import Metrics
    from yrelay.app.presence import Presence
    from yrelay.app.sessions import SessionRegistry
    from yrelay.app.ticker import Ticker
    from yrelay.auth import Authenticator, Revocations
    from yrelay.config import Settings
    from yrelay.observability.events import Events
    from yrelay.reconciliation.stream_digest import StreamDigests
    from yrelay.storage.append import Appender
    from yrelay.storage.reads import DocumentStore
    from yrelay.tracker import AckWriter, Tracker
    from yrelay.yjs.engine_pool import EnginePool
    from yrelay.yjs.validator import Validator


@dataclass(frozen=True, slots=True)
class HandshakeServices:
    """Who may connect, and for how long (:mod:`.handshake`)."""

    settings: Settings
    sessions: SessionRegistry
    authenticator: Authenticator
    revocations: Revocations


@dataclass(frozen=True, slots=True)
class AllowanceServices:
    """A connection's rates and its subject's quotas (:mod:`.allowance`, :mod:`.pacing`)."""

    settings: Settings
    limits: Limits
    authenticator: Authenticator
    metrics: Metrics


@dataclass(frozen=True, slots=True)
class WriteServices:
    """From a received update to its ``appended`` (:mod:`.write_path`)."""

    settings: Settings
    validator: Validator
    appender: Appender
    #: Bytes of updates between arrival and answer, all connections together.
    inflight_bytes: ByteBudget
    events: Events
    metrics: Metrics


@dataclass(frozen=True, slots=True)
class ReadServices:
    """What the subscriptions read, track and answer with (:mod:`.documents`,
    :mod:`.subscription`, :mod:`.sending`, :mod:`.resync`)."""

    settings: Settings
    store: DocumentStore
    fanout: Fanout
    tracker: Tracker
    ack_writer: AckWriter
    digests: StreamDigests
    engine: EnginePool
    #: Recent sync answers: one not changed is not computed again.
    answers: AnswerCache[Any]
    events: Events


@dataclass(frozen=True, slots=True)
class Services:
    """A connection's: its own few (the limits on connections, the ticker,
    the events) and its flows' bundles. A codec reads what it needs of
    these through its connection (the settings, the metrics, the
    authenticator)."""

    settings: Settings
    limits: Limits
    ticker: Ticker
    authenticator: Authenticator
    events: Events
    metrics: Metrics
    #: The process's presence relay, for :mod:`.presence`.
    presence: Presence
    handshake: HandshakeServices
    allowance: AllowanceServices
    writes: WriteServices
    reads: ReadServices
