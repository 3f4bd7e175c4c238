"""Server settings, each with a production default and a ``YRELAY_*`` variable."""

from __future__ import annotations

import importlib.util
import ipaddress
import math
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from yrelay.observability.eventlog import SUBJECT_MODES
from yrelay.transport.http_guard import guarded_protocol
from yrelay.transport.ws_protocol import uvicorn_ws_options

#: Upper bound of ``auth_leeway``: a token's expiry may be stretched, not ignored.
MAX_AUTH_LEEWAY = 60.0
#: Upper bound of ``ack_replicas_timeout``: the WAIT must end well before
#: the Redis connection's socket timeout (10 s) gives up on it.
MAX_ACK_REPLICAS_TIMEOUT = 5.0
#: The settings announced to clients in ``welcome`` (``limits``), in this order.
CLIENT_LIMITS = (
    "max_update_bytes",
    "max_frame_bytes",
    "max_docs_per_connection",
    "max_awareness_bytes",
    "updates_per_second",
    "update_burst",
    "max_connections_per_address",
    "subject_updates_per_second",
    "max_subscriptions_per_subject",
    "presence_per_second",
)


@dataclass(frozen=True)
class Settings:
    """Everything a server process needs to know; immutable once started."""

    #: ``None`` starts an embedded redis-server under ``data_dir``.
    redis_url: str | None = None
    #: ``redis_url`` is one seed node of a Redis Cluster (docs/operations.md#redis-cluster).
    redis_cluster: bool = False
    data_dir: Path = field(default_factory=lambda: Path("data"))
    host: str = "127.0.0.1"
    port: int = 8000

    #: Largest Yjs update accepted, in bytes (decoded).
    max_update_bytes: int = 16 * 1024 * 1024
    #: Largest websocket frame accepted, in bytes; checked before JSON decoding.
    max_frame_bytes: int = 1_500_000
    #: Websocket messages one connection's socket may hold received but not
    #: yet read by the server (uvicorn's ``ws_max_queue``, default 32). While a
    #: connection waits for its in-flight budget it stops reading, and each
    #: held message may be ``ws_max_size`` (16 MiB): 32 of them were 512 MiB
    #: a hostile client could pin per connection (docs/security.md#frames).
    ws_max_queue: int = 2
    #: permessage-deflate, when a client offers it (browsers do): off, as a
    #: deflate context per connection was half of an idle connection's
    #: memory; on, without context takeover and with small windows
    #: (yrelay/transport/ws_protocol.py; BENCHMARKS.md "Issue 20: idle memory").
    ws_compression: bool = False
    #: uvicorn's websocket implementation: websockets-sansio, websockets or wsproto.
    ws_implementation: str = "websockets-sansio"
    #: Documents one connection may subscribe to.
    max_docs_per_connection: int = 10_000
    #: Updates of one connection being appended at once (more waits).
    max_inflight_appends: int = 256
    #: Bytes of updates one connection may have between arrival and answer
    #: before it stops reading (yrelay/app/inflight.py) ...
    max_inflight_bytes_per_connection: int = 32 * 1024 * 1024
    #: ... and all connections of a process together.
    max_inflight_bytes: int = 256 * 1024 * 1024
    #: Entries sent to a subscription and not yet acked before sending pauses.
    max_unacked_entries: int = 5_000
    #: Entries sent and not yet acked on one connection, all its documents
    #: together, before its subscriptions pause for acks (0: no cap).
    max_unacked_per_connection: int = 20_000
    #: Bytes of fan-out batches one subscription may hold while it waits
    #: for its socket; past it they are dropped and read back from the stream.
    max_pending_bytes: int = 4 * 1024 * 1024
    #: Entries per catch-up read (XRANGE COUNT) and per deliver frame.
    page_size: int = 500
    #: Stream reads (catch-up pages, the fan-out's XREAD) ask for fewer
    #: entries when they are large, so one read of a document (and one
    #: deliver frame) stays near this many bytes.
    max_page_bytes: int = 1024 * 1024
    #: Largest snapshot / sync reply chunk, in bytes (before base64).
    chunk_bytes: int = 256 * 1024
    #: Resend unacked entries older than this (seconds) ...
    resend_after: float = 2.0
    #: ... checked this often when a document is quiet.
    resend_check_interval: float = 1.0
    #: Blocking XREAD timeout of the fan-out loop, in milliseconds.
    block_ms: int = 1_000
    #: How long a disconnected session id stays resumable, in seconds.
    session_ttl: int = 7 * 24 * 3600
    #: Python's young-generation GC threshold for the process (yrelay/observability/pygc.py;
    #: Python's is 700, which made full collections most of the CPU under
    #: load; 50000 doubles the many-documents rate the server keeps up with
    #: and costs ~1-3 MiB per process: BENCHMARKS.md, issue 20); 0 leaves
    #: the process's GC settings alone (a host with its own, when embedded).
    gc_young_threshold: int = 50_000

    #: Open websockets per client address (TCP peer IP) per process (0: no cap).
    max_connections_per_address: int = 256
    #: Updates per second of one session, refilled continuously ...
    updates_per_second: float = 200.0
    #: ... with this many saved up for bursts (a reconnect resending its buffer).
    update_burst: int = 1_000
    #: Frames per second one websocket is read at, any kind, and its burst;
    #: past it the socket is read more slowly (yrelay/app/core/pacing.py) ...
    frames_per_second: float = 1_000.0
    frame_burst: int = 4_000
    #: ... control frames (ping, subscribe, unsubscribe, sync, digests,
    #: awareness queries) per second and at once ...
    control_per_second: float = 50.0
    control_burst: int = 2_000
    #: ... bytes per second of answers larger than their requests
    #: (snapshots, sync replies, greetings) and at once ...
    answer_bytes_per_second: int = 4 * 1024 * 1024
    answer_burst_bytes: int = 32 * 1024 * 1024
    #: ... and the hard bound: a websocket held back by these rates (and the
    #: update limits) for more than this many seconds of the last ~30 is
    #: closed with 4429 (0: never).
    throttle_close_seconds: float = 10.0
    #: Largest websocket message before the connection authenticated
    #: (``hello`` on /ws, the upgrade's token on /yws); 1009 past it.
    preauth_max_frame_bytes: int = 64 * 1024
    #: Bytes of websocket messages being received (partial frames and
    #: unparsed reads) across every connection of the process; a connection
    #: that takes it past is closed with 1013 (0: no cap).
    max_receiving_bytes: int = 128 * 1024 * 1024
    #: New websockets admitted per second by one process (0: no cap) ...
    admission_rate: float = 200.0
    #: ... and at once after a quiet spell.
    admission_burst: int = 400
    #: Validator processes that run pycrdt (and y-py, below) on every
    #: update before it is stored (0: in the server process, which a
    #: hostile update can abort; see docs/security.md).
    validator_workers: int = 2
    #: Also check every update with y-py, and prove every GC snapshot
    #: against a y-py reload: for deployments with Python clients on the
    #: y-py engine, so nothing a y-py client aborts on, or cannot reload,
    #: is stored. Needs the ``ypy`` extra (the server refuses to start
    #: without it) and costs a second engine per update.
    validate_with_ypy: bool = False
    #: Seconds a validator process may spend on one batch before it is
    #: killed and restarted (its updates are then checked one by one).
    validate_timeout: float = 2.0
    #: CRDT engine processes (pycrdt) that compute sync answers and GC
    #: folds, started with the server (0: a thread of the server process) ...
    engine_workers: int = 2
    #: ... and the seconds one may spend on one document before it is killed
    #: (the sync is answered ``document_unavailable``, the fold waits).
    engine_timeout: float = 10.0

    #: Largest awareness (presence) update accepted, in bytes (decoded).
    max_awareness_bytes: int = 32 * 1024
    #: A presence state not renewed for this many seconds is dropped
    #: (y-protocols' outdatedTimeout; browsers renew every 15 s).
    presence_timeout: float = 30.0
    #: A ``/yws`` client whose socket was sent nothing for this many seconds
    #: gets its own awareness renewal back (as y-websocket's server echoes
    #: every one): stock clients close a socket silent for 30 s and renew
    #: every 15 s, so a client alone in a document would flicker offline.
    yws_echo_after: float = 10.0
    #: Awareness updates per second of one connection, all its documents
    #: together (0: no cap) ...
    presence_per_second: float = 30.0
    #: ... with this many saved up (a browser sends one per cursor move).
    presence_burst: int = 100
    #: ClientIDs one connection may speak for on one document (a browser: 1).
    max_presence_clients_per_connection: int = 4
    #: ClientIDs claimed on one document at once, across the deployment;
    #: bounds the presence hash and so every newcomer's greeting.
    max_presence_clients_per_document: int = 500
    #: Bytes of states one greeting carries at most (newest first).
    max_presence_greeting_bytes: int = 1024 * 1024

    #: Per subject (the token's ``sub``; with auth off, the client address),
    #: across every socket and every server process, kept in Redis
    #: (docs/operations.md#limits; 0: no cap). Updates per second ...
    subject_updates_per_second: float = 500.0
    #: ... with this many saved up.
    subject_update_burst: int = 2_000
    #: Awareness updates per second of one subject, and its burst.
    subject_presence_per_second: float = 100.0
    subject_presence_burst: int = 300
    #: Bytes per second of answers larger than their requests (snapshots,
    #: sync replies, awareness greetings) one subject may be sent, all its
    #: connections together, and its burst; past it its requests wait.
    subject_answer_bytes_per_second: int = 16 * 1024 * 1024
    subject_answer_burst_bytes: int = 64 * 1024 * 1024
    #: Live subscriptions (connection x document) of one subject.
    max_subscriptions_per_subject: int = 2_000
    #: A process's count of a subject's subscriptions lapses this many
    #: seconds after the process last renewed it (a crashed process).
    subscription_lease: float = 60.0

    #: Seconds between GC passes of this process (0 turns the loop off).
    gc_interval: float = 10.0
    #: Evict a session lacking an entry this many seconds older than the most
    #: advanced session's position (while one session is healthy).
    gc_relative_delta: float = 30.0
    #: When no session is healthy: evict sessions lacking an entry this many
    #: seconds older than now. Must exceed ``gc_relative_delta``.
    gc_absolute_delta: float = 1800.0
    #: Documents claimed per round of a GC pass.
    gc_batch_size: int = 500
    #: Entries folded into a snapshot per document per round.
    gc_max_fold_entries: int = 10_000
    #: A claimed document is handed to another process after this (seconds).
    gc_lease: float = 60.0
    #: Evict a consumer group none of whose members heartbeats once it lacks
    #: an entry this many seconds older than the document's newest ...
    gc_group_abandoned_delta: float = 600.0
    #: ... and a live group only once it lacks an entry this many seconds
    #: older than now (docs/consumers.md).
    gc_group_absolute_delta: float = 86_400.0
    #: A deleted document refuses writes this long (seconds; yrelay/gc/deletion.py).
    delete_tombstone_seconds: float = 3600.0

    #: Write the event log (docs/events.md) under ``data_dir/events``.
    event_log: bool = True
    #: Start a new event log file past this size (bytes) ...
    event_log_max_bytes: int = 64 * 1024 * 1024
    #: ... or this age (seconds).
    event_log_max_age: float = 3600.0
    #: Events buffered in memory before new ones are dropped (and counted).
    event_log_buffer: int = 100_000
    #: How ``connect`` events record the session's subject: ``hash`` (a
    #: SHA-256 prefix), ``plain``, or ``off`` (docs/events.md).
    event_log_subject: str = "hash"

    #: At start-up, recompute every stored drift digest from the streams,
    #: log the wrong ones and fix them (seconds to minutes on a large store).
    verify_digests: bool = False

    #: Bearer token of the /ops endpoints; without one they answer 403.
    ops_token: str | None = field(default=None, repr=False)
    #: Bearer token for /metrics only (the ops token works too); without
    #: either, /metrics answers loopback clients only.
    metrics_token: str | None = field(default=None, repr=False)
    #: Count Prometheus metrics (off only to measure what they cost).
    metrics: bool = True

    #: Secret that signs client tokens (JWT, docs/security.md). Required
    #: unless an ``auth_hook`` is set or auth is switched off.
    auth_secret: str | None = field(default=None, repr=False)
    #: Signature algorithms accepted (comma-separated in the environment).
    auth_algorithms: tuple[str, ...] = ("HS256",)
    #: When set, tokens must carry this ``aud`` / ``iss``.
    auth_audience: str | None = None
    auth_issuer: str | None = None
    #: ``package.module:factory`` returning an Authenticator (an app's own user system).
    auth_hook: str | None = None
    #: Development only: no authentication, everyone reads and writes
    #: everything. The server says so loudly at start and in every welcome.
    insecure_no_auth: bool = False
    #: Browser origins allowed to connect besides the server's own
    #: (comma-separated; ``*`` allows any). Clients without Origin are not browsers.
    allowed_origins: tuple[str, ...] = ()
    #: Seconds between refreshes of the revoked-token list (and expiry checks).
    revocation_refresh: float = 2.0
    #: Seconds a token is still accepted past its ``exp`` (clock skew between
    #: the token's issuer and this server); revocations are kept that much
    #: longer. At most ``MAX_AUTH_LEEWAY``.
    auth_leeway: float = 5.0
    #: The URL browsers load this server's own pages from (``https://relay.example.com``);
    #: its origin is the one browser origin allowed besides ``allowed_origins``.
    #: Never taken from the request's ``Host`` (DNS rebinding). ``yrelay serve``
    #: defaults it to ``http://<host>:<port>`` (``localhost`` too on loopback).
    public_url: str | None = None

    #: Seconds a websocket has to send ``hello`` before it is closed (4408).
    hello_timeout: float = 10.0
    #: Seconds an HTTP connection has to deliver a complete request head (and
    #: body) from its first byte or its connect, else it is closed (slowloris).
    header_timeout: float = 10.0
    #: Connections whose request head is not complete yet, per process; past
    #: it the oldest of them is closed (0: no cap).
    max_pending_connections: int = 1024
    #: Largest request head (request line and headers), in bytes: 431 past it.
    max_header_bytes: int = 16 * 1024

    #: Server processes of ``yrelay serve`` on one port (``auto``: one per
    #: core); each has its own fan-out, GC loop and workers (yrelay/supervisor.py).
    workers: str = "1"
    #: Proxy addresses or networks (``10.0.0.0/8``) whose ``X-Forwarded-For``
    #: names the client; from any other peer the header is ignored.
    trusted_proxies: tuple[str, ...] = ()
    #: Replicas that must hold an update before it is ``appended`` (Redis
    #: ``WAIT`` after each append batch; 0: answer once the master has it) ...
    ack_replicas: int = 0
    #: ... and how long to wait for them (seconds); past it the client gets
    #: ``replication_timeout`` (the entry is stored) and resends.
    ack_replicas_timeout: float = 1.0

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                raise ValueError(f"{item.name} must not be negative, got {value!r}")
            if item.name in _PERIODS and value == 0:
                raise ValueError(f"{item.name} must be more than 0: {_PERIODS[item.name]}")
        if self.event_log_subject not in SUBJECT_MODES:
            raise ValueError(
                f"event_log_subject must be one of {', '.join(SUBJECT_MODES)}, got {self.event_log_subject!r}"
            )
        if self.gc_absolute_delta <= self.gc_relative_delta:
            raise ValueError("gc_absolute_delta must be larger than gc_relative_delta")
        if self.public_url and (
            urlsplit(self.public_url).scheme not in ("http", "https") or not urlsplit(self.public_url).hostname
        ):
            raise ValueError(f"public_url must be an http(s) URL, got {self.public_url!r}")
        if not 0 <= self.auth_leeway <= MAX_AUTH_LEEWAY:
            raise ValueError(f"auth_leeway must be between 0 and {MAX_AUTH_LEEWAY:g} seconds")
        self.worker_count()  # raises on a bad value
        if self.ws_implementation not in ("websockets-sansio", "websockets", "wsproto"):
            raise ValueError(
                f"ws_implementation must be websockets-sansio, websockets or wsproto, got {self.ws_implementation!r}"
            )
        for proxy in self.trusted_proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(f"trusted_proxies: {proxy!r} is not an IP address or network") from None
        if self.validate_with_ypy and not _ypy_installed():
            raise ValueError(
                "validate_with_ypy needs y-py, the ypy extra: pip install 'yrelay[ypy]' "
                "(y-py 0.6.2 installs on CPython 3.10-3.12 only)"
            )
        if self.ack_replicas < 0 or not 0 < self.ack_replicas_timeout <= MAX_ACK_REPLICAS_TIMEOUT:
            raise ValueError(
                "ack_replicas must be 0 or more and ack_replicas_timeout between 0 (excluded) "
                f"and {MAX_ACK_REPLICAS_TIMEOUT:g} seconds"
            )

    def worker_count(self) -> int:
        """``workers`` as a number: ``auto`` is the cores this process may use."""
        if self.workers.strip().lower() == "auto":
            return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        try:
            count = int(self.workers)
        except ValueError:
            count = 0
        if count < 1:
            raise ValueError(f"workers must be a positive integer or 'auto', got {self.workers!r}")
        return count

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Defaults, then ``YRELAY_<FIELD>`` variables, then explicit overrides."""
        values: dict[str, Any] = {}  # each of its field's type: _convert checks the variables
        for item in fields(cls):
            raw = os.environ.get(f"YRELAY_{item.name.upper()}")
            if raw is not None:
                values[item.name] = _convert(item.name, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **values)

    def client_limits(self) -> dict[str, float]:
        """Limits announced to clients in ``welcome``."""
        return {name: getattr(self, name) for name in CLIENT_LIMITS}

    def uvicorn_options(self) -> dict[str, object]:
        """What ``yrelay serve`` and the tests' in-process servers give uvicorn.

        ``ws_max_size`` bounds a message *after* permessage-deflate inflation
        (websockets stops inflating past it and closes with 1009), so a
        compression bomb costs at most this much memory. Frames between
        ``max_frame_bytes`` and it are answered with ``frame_too_large``.
        ``http`` is uvicorn's httptools protocol with the request-head
        deadline and caps (:mod:`yrelay.transport.http_guard`)."""
        # /yws takes one update per message (stock clients cannot split), up to max_update_bytes.
        return {
            "ws_max_size": max(self.max_frame_bytes * 4, self.max_update_bytes + 64),
            "ws_ping_interval": 20,
            "ws_ping_timeout": 20,
            "ws_max_queue": self.ws_max_queue,
            "http": guarded_protocol(self.header_timeout, self.max_pending_connections, self.max_header_bytes),
            **uvicorn_ws_options(
                self.ws_implementation, self.ws_compression, self.preauth_max_frame_bytes, self.max_receiving_bytes
            ),
            **self.proxy_options(),
        }

    def proxy_options(self) -> dict[str, object]:
        """uvicorn's ``X-Forwarded-For`` handling, from ``trusted_proxies``
        only. uvicorn's own default trusts loopback peers, so any local
        process could have named itself any client address: off unless set.
        Its middleware rewrites the ASGI ``client`` of HTTP requests and
        websockets alike, which is the address the per-address limits use."""
        if not self.trusted_proxies:
            return {"proxy_headers": False}
        return {"proxy_headers": True, "forwarded_allow_ips": ",".join(self.trusted_proxies)}


#: Spellings a boolean variable accepts (case-insensitive); anything else
#: is refused, so ``YRELAY_METRICS=on`` cannot quietly mean "off".
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


#: Settings 0 cannot mean: each is how often a loop runs, or how much one
#: read takes, and 0 would spin that loop or block a read for ever.
_PERIODS = {
    "resend_check_interval": "every connection's checks would run in a busy loop",
    "revocation_refresh": "the revoked list would be read from Redis in a busy loop",
    "yws_echo_after": "a held /yws room would be sent awareness in a busy loop",
    "subscription_lease": "the subscription counts would be renewed in a busy loop",
    "block_ms": "Redis reads BLOCK 0 as waiting for ever",
    "page_size": "a stream read of 0 entries reads nothing",
    "chunk_bytes": "an answer cannot be cut into chunks of 0 bytes",
}


def _ypy_installed() -> bool:
    return importlib.util.find_spec("y_py") is not None


def _convert(name: str, raw: str) -> object:
    """``raw`` as the type of the field's default; a ValueError naming the
    variable and what it expects otherwise (shown as is by ``yrelay serve``)."""
    default = getattr(Settings(), name)
    if isinstance(default, Path) or name == "data_dir":
        return Path(raw)
    if isinstance(default, bool):
        return _boolean(name, raw)
    if isinstance(default, tuple):
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if isinstance(default, int):
        return _number(name, raw, int, "an integer")
    if isinstance(default, float):
        return _number(name, raw, float, "a number")
    return raw or None


def _boolean(name: str, raw: str) -> bool:
    word = raw.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(f"YRELAY_{name.upper()}={raw!r}: expected a boolean (1/0, true/false, yes/no, on/off)")


def _number(name: str, raw: str, kind: type[int] | type[float], expected: str) -> int | float:
    try:
        value = kind(raw.strip())
    except ValueError:
        value = None
    if value is None or not math.isfinite(value):  # nan/inf would pass every later comparison wrongly
        raise ValueError(f"YRELAY_{name.upper()}={raw!r}: expected {expected}")
    return value
