"""The end-of-run check: no acknowledged update lost, every replica equal.

An update counts as *acked* once some client wrote its ``appended`` to
``acked.jsonl``. After the faults stop and the clients settle it must be in
every live client's final document and in the server's (snapshot + stream,
and again after a last GC pass); all of them must have the same content.
Acked updates that Redis itself lost (a failover, a restart from an AOF
missing its tail) and that clients gave back are *recovered*, not lost; one
that is missing anywhere at the end is a loss, and the check raises
:class:`~yrelay_tools.testing.checker.DeliveryViolation`.

Stored is not enough either (issue 15): after the run's last GC pass every
stream must have folded into its snapshot, no document may report an entry
GC cannot fold past (``blocked_at``), and no stored entry may be *stuck*:
one that no replica can apply because something it builds on was never
stored (:class:`~yrelay.yjs.admission.StateBuilder` over snapshot + stream).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from redis.asyncio import Redis

from yrelay.storage.client import YrelayCluster
from yrelay.storage.keys import meta_key, stream_key
from yrelay.storage.reads import DocumentStore, Entry, HistoryTrimmed, Snapshot
from yrelay.storage.replies import text
from yrelay.yjs import crdt, update_format
from yrelay.yjs.admission import Blocked, StateBuilder
from yrelay_tools.chaos.clients import AckRecord
from yrelay_tools.testing.checker import (
    DeliveryViolation,
    absent_ranges,
    check_delivery,
    decode_updates,
    missing_from_state,
)

#: An acked update: its document and the SHA-256 of its bytes.
UpdateKey = tuple[str, str]


def update_key(doc: str, update: bytes) -> UpdateKey:
    return doc, hashlib.sha256(update).hexdigest()


@dataclass
class DeliveryFigures:
    #: ``appended`` answers clients recorded (a resent update may be acked twice).
    acks: int = 0
    #: Distinct acked updates.
    acked_updates: int = 0
    #: Acked updates missing from some replica at the end: must be 0.
    lost: int = 0
    #: Acked updates Redis lost at some point (failover, AOF restart) ...
    lost_from_redis: int = 0
    #: ... and of those, the ones clients gave back.
    recovered: int = 0
    #: Updates appended to a stream more than once (acked with different ids:
    #: a resend after its dedup entry was trimmed, or under a new session).
    stream_duplicates: int = 0
    #: Stored entries no replica can apply in full, after the last GC pass: must be 0.
    stuck: int = 0
    #: Entries left in the streams after the last GC pass (not folded into
    #: the snapshot although every live client had acked them): must be 0.
    unfolded: int = 0
    #: Documents whose fold GC reports blocked (``blocked_at``): must be 0.
    blocked: int = 0
    #: Documents whose stream folded completely into the snapshot.
    folded_streams: int = 0
    #: Final content length per document.
    content_length: dict[str, int] = field(default_factory=dict)


def acked_updates(records: Iterable[AckRecord]) -> dict[str, dict[UpdateKey, bytes]]:
    """Distinct acked updates per document."""
    by_doc: dict[str, dict[UpdateKey, bytes]] = defaultdict(dict)
    for record in records:
        by_doc[record.doc][update_key(record.doc, record.update)] = record.update
    return by_doc


def missing_keys(state: bytes, updates: Mapping[UpdateKey, bytes]) -> set[UpdateKey]:
    """The acked ``updates`` a document (its encoded ``state``) does not hold."""
    keys = list(updates)
    return {keys[index] for index in missing_from_state(state, decode_updates(updates.values()))}


def connect(redis_url: str, cluster: bool = False, **options: object) -> Redis:
    """The harness's own client: of one Redis, or (``cluster``) of a Redis
    Cluster seeded by ``redis_url``, as the servers connect."""
    if cluster:
        return YrelayCluster.from_url(redis_url, **options)  # type: ignore[return-value]
    return Redis.from_url(redis_url, **options)  # type: ignore[arg-type]


async def stored_updates(redis_url: str, docs: Iterable[str], cluster: bool = False) -> dict[str, list[bytes]]:
    """Each document's snapshot and stream entries as stored, not applied."""
    redis = connect(redis_url, cluster, socket_timeout=30)
    try:
        store, stored = DocumentStore(redis), {}
        for doc in docs:
            snapshot, entries = await _snapshot_and_entries(store, doc)
            stored[doc] = ([snapshot.update] if snapshot.update else []) + [entry.update for entry in entries]
        return stored
    finally:
        await redis.aclose()


async def _snapshot_and_entries(store: DocumentStore, doc: str) -> tuple[Snapshot, list[Entry]]:
    """The snapshot and every stream entry after it, read consistently."""
    while True:
        snapshot = await store.load_snapshot(doc)
        entries: list[Entry] = []
        try:
            async for page in store.iter_entries(doc, snapshot.offset):
                entries += page
        except HistoryTrimmed:
            continue  # a GC pass trimmed while we read: from its new snapshot
        return snapshot, entries


def not_stored(stored: list[bytes], updates: Mapping[UpdateKey, bytes]) -> set[UpdateKey]:
    """The acked ``updates`` whose inserts and deletes are in none of the
    ``stored`` ones. Unlike a check against the document, an update that is
    stored but waits for a dependency (a resend not appended yet) counts as
    stored: this measures what Redis lost, not what it can apply yet."""
    whole = update_format.union(part for part in decode_updates(stored) if part is not None)
    keys = list(updates)
    return {
        keys[index]
        for index, part in enumerate(decode_updates(updates.values()))
        if part is None or not update_format.covers(whole, part)
    }


@dataclass
class StreamState:
    """One document's storage after the run's last GC pass."""

    doc: str
    #: Entries still in the stream.
    length: int
    #: The entry GC's fold stops at (meta ``blocked_at``), if any.
    blocked_at: str | None
    #: Stored entries no replica can apply in full.
    stuck: list[Blocked]

    @property
    def folded(self) -> bool:
        return self.length == 0 and self.blocked_at is None and not self.stuck


def stuck_entries(snapshot: bytes, entries: list[Entry]) -> list[Blocked]:
    """The ``entries`` (after ``snapshot``, in stream order) that a document
    built from them can never apply in full: integrated as Yjs does, whatever
    is still waiting once all of them are in waits for good. A deletion of
    content the document does not hold is not stuck: there is nothing to
    show deleted, and GC's snapshot keeps it pending in case the content
    comes (``update_format.pending_deletes``)."""
    builder = StateBuilder()
    if snapshot:
        builder.add("snapshot", snapshot)
    for entry in entries:
        builder.add(str(entry.id), entry.update)
    order = {str(entry.id): index for index, entry in enumerate(entries)}
    return sorted(builder.blocked, key=lambda blocked: order.get(blocked.entry_id, -1))


async def stream_states(redis_url: str, docs: Iterable[str], cluster: bool = False) -> list[StreamState]:
    """What each document's storage holds: stream length, GC's ``blocked_at``
    and the stuck entries of snapshot + stream."""
    redis = connect(redis_url, cluster, socket_timeout=30)
    try:
        store, states = DocumentStore(redis), []
        for doc in docs:
            snapshot, entries = await _snapshot_and_entries(store, doc)
            length, blocked_at = await redis.xlen(stream_key(doc)), await redis.hget(meta_key(doc), "blocked_at")
            stuck = await asyncio.to_thread(stuck_entries, snapshot.update, entries)
            states.append(StreamState(doc, int(length), text(blocked_at) if blocked_at else None, stuck))
        return states
    finally:
        await redis.aclose()


def check_streams(streams: Iterable[StreamState], figures: DeliveryFigures) -> list[str]:
    """Count stuck, unfolded and blocked into ``figures``; the problems found."""
    problems = []
    for state in streams:
        figures.stuck += len(state.stuck)
        figures.unfolded += state.length
        figures.blocked += state.blocked_at is not None
        figures.folded_streams += state.folded
        if state.stuck:
            sample = ", ".join(f"{b.entry_id} (lacks {_clocks(b.missing)})" for b in state.stuck[:3])
            problems.append(f"{state.doc}: {len(state.stuck)} stored entries no replica can apply: {sample}")
        if state.blocked_at is not None:
            problems.append(f"{state.doc}: GC cannot fold past {state.blocked_at}")
        if state.length and not state.stuck and state.blocked_at is None:
            problems.append(f"{state.doc}: {state.length} entries left in the stream after the last GC pass")
    return problems


def _clocks(missing: dict[int, int]) -> str:
    return ", ".join(f"client {client} from clock {clock}" for client, clock in missing.items()) or "undecodable"


async def server_documents(redis_url: str, docs: Iterable[str], cluster: bool = False) -> dict[str, crdt.Doc]:
    """Each document as a new subscriber would load it: snapshot + stream."""
    redis = connect(redis_url, cluster, socket_timeout=30)
    try:
        store = DocumentStore(redis)
        return {doc: (await store.load_document(doc))[0] for doc in docs}
    finally:
        await redis.aclose()


def check_run(
    records: list[AckRecord],
    replicas: Mapping[str, Mapping[str, crdt.Doc]],
    lost_from_redis: set[UpdateKey],
    streams: Iterable[StreamState] = (),
) -> DeliveryFigures:
    """``replicas``: replica name (``client-3``, ``server``) -> document -> its
    final state; ``streams``: the storage after the last GC pass. Raises
    DeliveryViolation naming every document that lost an acked update (and
    the ``(client, clock)`` ranges of a few), diverged, or kept a stuck or
    unfolded stream; the figures are on the exception as ``figures``."""
    figures = DeliveryFigures(acks=len(records))
    ids: dict[UpdateKey, set[str]] = defaultdict(set)
    for record in records:
        ids[update_key(record.doc, record.update)].add(record.id)
    figures.stream_duplicates = sum(len(found) - 1 for found in ids.values())
    problems: list[str] = []
    lost: set[UpdateKey] = set()
    for doc, updates in sorted(acked_updates(records).items()):
        figures.acked_updates += len(updates)
        holders = {name: docs[doc] for name, docs in replicas.items() if doc in docs}
        states = {name: crdt.encode_state(ydoc) for name, ydoc in holders.items()}
        absent: dict[UpdateKey, list[str]] = defaultdict(list)
        for name, state in states.items():
            for key in missing_keys(state, updates):
                absent[key].append(name)
        lost |= set(absent)
        problems += [
            f"{doc}: acked update {key[1][:12]} missing: "
            + "; ".join(f"{name} lacks {_ranges(states[name], updates[key])}" for name in names[:3])
            for key, names in list(absent.items())[:3]
        ]
        try:
            report = check_delivery(holders, updates.values())
            figures.content_length[doc] = len(report.content)
        except DeliveryViolation as violation:
            problems.append(f"{doc}: {violation}")
    figures.lost = len(lost)
    figures.lost_from_redis = len(lost_from_redis)
    figures.recovered = len(lost_from_redis - lost)
    problems += check_streams(streams, figures)
    if problems:
        error = DeliveryViolation("; ".join(problems))
        error.figures = figures  # type: ignore[attr-defined]
        raise error
    return figures


def _ranges(state: bytes, update: bytes) -> str:
    try:
        absent = absent_ranges(state, update_format.decode(update))
    except update_format.MalformedUpdate:
        return "it (undecodable)"
    return ", ".join(
        f"client {client} clocks {start}-{end - 1}" for client, spans in absent.items() for start, end in spans[:2]
    )


def server_event_counts(root: Path) -> Counter[str]:
    """Totals from the servers' event logs: ``resend``, ``evict``,
    ``resync:<reason>``, ``append:duplicate`` (a killed server's last ~200 ms
    of events may be missing)."""
    counts: Counter[str] = Counter()
    for path in root.glob("servers/*/events/*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.get("type")
            if kind == "resync":
                counts[f"resync:{event.get('reason')}"] += 1
            elif kind == "append":
                counts["append:duplicate" if event.get("duplicate") else "append"] += 1
            elif kind in ("resend", "evict", "connect", "snapshot", "trim"):
                counts[kind] += 1
    return counts
