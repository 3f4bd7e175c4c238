"""The two tables the ``yrelay`` data source reads, as Arrow record batches.

``entries`` has one row per stream entry, ``tracker`` one row per tracked
session of a document with its lag. Their Arrow schemas below are the single
definition: the Spark schemas are derived from them, and the analysis job
relies on the exact names and types.

Rows are gathered across the documents of a partition and cut into batches of
:data:`BATCH_ROWS`, so a partition of many small documents still crosses into
the JVM in a few batches rather than one per document.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from itertools import chain, islice

import pyarrow as pa

from yrelay.spark_analytics.redis_connection import SyncRedis
from yrelay.spark_analytics.redis_options import Kind, SourceOptions
from yrelay.spark_analytics.redis_pages import entry_id, stream_pages, tracker_pages
from yrelay.storage.keys import meta_key
from yrelay.storage.offsets import ZERO, StreamId
from yrelay.storage.replies import RawEntry, stream_id

#: One row of a table (values in its schema's column order).
Row = tuple[object, ...]

BATCH_ROWS = 4096

ENTRIES_SCHEMA = pa.schema(
    [
        ("doc", pa.string()),
        ("id", pa.string()),  # "<ms>-<seq>"
        ("ms", pa.int64()),
        ("seq", pa.int32()),
        ("score", pa.int64()),  # ms * 1000 + seq, as in the tracker
        ("session", pa.string()),  # field s: the session that sent the update
        ("clock", pa.int64()),  # field c: that session's clock for it
        ("bytes", pa.int32()),  # length of field u, the Yjs update
    ]
)
#: Added to ENTRIES_SCHEMA by option ``withUpdates=true``.
UPDATE_FIELD = pa.field("update", pa.binary())

TRACKER_SCHEMA = pa.schema(
    [
        ("doc", pa.string()),
        ("session", pa.string()),
        ("offset", pa.string()),  # "<ms>-<seq>" of the score
        ("score", pa.int64()),
        ("ms", pa.int64()),  # the offset's ms
        ("lag_entries", pa.int64()),  # stream entries after the offset (capped walk)
        ("lag_ms", pa.int64()),  # last appended id's ms - offset's ms, at least 0
    ]
)


def arrow_schema(options: SourceOptions) -> pa.Schema:
    """The schema of the table ``options`` select."""
    if options.kind is Kind.TRACKER:
        return TRACKER_SCHEMA
    return ENTRIES_SCHEMA.append(UPDATE_FIELD) if options.with_updates else ENTRIES_SCHEMA


def table_batches(client: SyncRedis, options: SourceOptions, docs: Iterable[str]) -> Iterator[pa.RecordBatch]:
    """The selected table's rows for ``docs``, in batches of at most BATCH_ROWS."""
    if options.kind is Kind.TRACKER:
        rows = chain.from_iterable(tracker_rows(client, doc, options.lag_cap) for doc in docs)
    else:
        rows = chain.from_iterable(entry_rows(client, doc, options.with_updates) for doc in docs)
    return arrow_batches(rows, arrow_schema(options))


def arrow_batches(rows: Iterable[Row], schema: pa.Schema, size: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Row tuples (in ``schema``'s column order) as record batches of ``size`` rows."""
    rows = iter(rows)
    while chunk := list(islice(rows, size)):
        columns = zip(*chunk, strict=True)
        arrays = [pa.array(column, type=field.type) for column, field in zip(columns, schema, strict=True)]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def entry_rows(client: SyncRedis, doc: str, with_updates: bool = False) -> Iterator[Row]:
    """One ENTRIES_SCHEMA row per entry of ``doc``'s stream, in id order."""
    for page in stream_pages(client, doc):
        for raw_id, fields in page:
            yield _entry_row(doc, raw_id, fields, with_updates)


def _entry_row(doc: str, raw_id: bytes, fields: dict[bytes, bytes], with_updates: bool) -> Row:
    ident = entry_id(raw_id)
    session, clock, update = fields.get(b"s"), fields.get(b"c"), fields.get(b"u", b"")
    row = (
        doc,
        str(ident),
        ident.ms,
        ident.seq,
        ident.score(),
        session.decode() if session is not None else None,
        int(clock) if clock is not None else None,
        len(update),
    )
    return (*row, update) if with_updates else row


def tracker_rows(client: SyncRedis, doc: str, lag_cap: int) -> Iterator[Row]:
    """One TRACKER_SCHEMA row per session tracked on ``doc``, lowest offset first.

    The figures are those of :func:`yrelay.tracker.lag.document_status` (what
    /ops reports): ``lag_ms`` against meta ``last_id`` (the last id appended),
    ``lag_entries`` from one walk of the stream after the lowest offset that
    stops after ``lag_cap`` entries, so past the cap it is a lower bound.
    """
    last = stream_id(client.hget(meta_key(doc), "last_id")) or ZERO
    pages = tracker_pages(client, doc)
    first = next(pages, None)
    if first is None:
        return
    later = _scores_after(client, doc, StreamId.from_score(first[0][1]), lag_cap)
    for session, score in chain.from_iterable(chain([first], pages)):
        offset = StreamId.from_score(score)
        behind = len(later) - bisect.bisect_right(later, score)
        yield doc, session, str(offset), score, offset.ms, behind, max(0, last.ms - offset.ms)


def _scores_after(client: SyncRedis, doc: str, after: StreamId, cap: int) -> list[int]:
    """Scores of the first ``cap`` entries of ``doc``'s stream after ``after``, ascending."""
    entries: Iterator[RawEntry] = chain.from_iterable(stream_pages(client, doc, str(after)))
    return [entry_id(raw_id).score() for raw_id, _ in islice(entries, cap)]
