"""The end-of-run check: no acknowledged update lost, every replica equal.

An update counts as *acked* once some client wrote its ``appended`` to
``acked.jsonl``. After the faults stop and the clients settle it must be in
every live client's final document and in the server's (snapshot + stream,
and again after a last GC pass); all of them must have the same content.
Acked updates that Redis itself lost (a failover, a restart from an AOF
missing its tail) and that clients gave back are *recovered*, not lost; one
that is missing anywhere at the end is a loss, and the check raises
:class:`~yrelay.testing.checker.DeliveryViolation`.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from redis.asyncio import Redis

from .. import crdt, update_format
from ..store import DocumentStore, HistoryTrimmed
from ..testing.checker import DeliveryViolation, check_delivery, decode_updates, missing_from_state
from .clients import AckRecord

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


async def stored_updates(redis_url: str, docs: Iterable[str]) -> dict[str, list[bytes]]:
    """Each document's snapshot and stream entries as stored, not applied."""
    redis = Redis.from_url(redis_url, socket_timeout=30)
    try:
        store, stored = DocumentStore(redis), {}
        for doc in docs:
            while True:
                snapshot = await store.load_snapshot(doc)
                updates = [snapshot.update] if snapshot.update else []
                try:
                    async for page in store.iter_entries(doc, snapshot.offset):
                        updates += [entry.update for entry in page]
                except HistoryTrimmed:
                    continue  # a GC pass trimmed while we read: from its new snapshot
                stored[doc] = updates
                break
        return stored
    finally:
        await redis.aclose()


def not_stored(stored: list[bytes], updates: Mapping[UpdateKey, bytes]) -> set[UpdateKey]:
    """The acked ``updates`` whose inserts and deletes are in none of the
    ``stored`` ones. Unlike a check against the document, an update that is
    stored but waits for a dependency (a resend not appended yet) counts as
    stored: this measures what Redis lost, not what it can apply yet."""
    whole = update_format.union(part for part in decode_updates(stored) if part is not None)
    keys = list(updates)
    return {keys[index] for index, part in enumerate(decode_updates(updates.values()))
            if part is None or not update_format.covers(whole, part)}


async def server_documents(redis_url: str, docs: Iterable[str]) -> dict[str, crdt.Doc]:
    """Each document as a new subscriber would load it: snapshot + stream."""
    redis = Redis.from_url(redis_url, socket_timeout=30)
    try:
        store = DocumentStore(redis)
        return {doc: (await store.load_document(doc))[0] for doc in docs}
    finally:
        await redis.aclose()


def check_run(
    records: list[AckRecord],
    replicas: Mapping[str, Mapping[str, crdt.Doc]],
    lost_from_redis: set[UpdateKey],
) -> DeliveryFigures:
    """``replicas``: replica name (``client-3``, ``server``) -> document -> its
    final state. Raises DeliveryViolation naming every document that lost an
    acked update or diverged; the figures are on the exception as ``figures``."""
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
        for name, ydoc in holders.items():
            lost |= missing_keys(crdt.encode_state(ydoc), updates)
        try:
            report = check_delivery(holders, updates.values())
            figures.content_length[doc] = len(report.content)
        except DeliveryViolation as violation:
            problems.append(f"{doc}: {violation}")
    figures.lost = len(lost)
    figures.lost_from_redis = len(lost_from_redis)
    figures.recovered = len(lost_from_redis - lost)
    if problems:
        error = DeliveryViolation("; ".join(problems))
        error.figures = figures  # type: ignore[attr-defined]
        raise error
    return figures


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
