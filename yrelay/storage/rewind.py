"""Finding documents whose stream went back: a Redis failover to a replica
that had not received the last writes (``ack_replicas 0``: asynchronous
replication), or a restart from an AOF or a backup that lacks them.

The entries lost were delivered to clients, or acked to their writers, who
still hold them; the clients whose websocket stayed open never resubscribe,
so the drift check of a subscribe (:func:`.resync.resume_point`) never runs
for them. The reader loop (:mod:`.reader`) therefore asks, after it saw
Redis fail and before it reads again, whether the ids it had seen, and those
its subscribers were sent, are still there (:func:`find_rewound`: a
subscriber may have read ahead of the fan-out, e.g. a sync answer, issue
39); the subscribers of a document that lost
some resync (``resync_required ahead``), and their two-way exchange gives the
server back what it lost. Nothing here runs on the hot path: one round trip
per reconnect, pipelined over the process's documents.

"Still there" is asked of the ids, not of the last id alone: once a new
entry was appended after the failover, the stream's last id is past
everything the process had seen even though a stretch before it is gone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from yrelay.storage.client import UNREACHABLE
from yrelay.storage.keys import meta_key, stream_key
from yrelay.storage.offsets import ZERO, StreamId
from yrelay.storage.replies import stream_id

#: Documents per pipeline: a process following 100k documents checks them
#: in pages, not in one 300k-command pipeline.
PAGE = 1000


async def find_rewound(redis: Any, seen: Mapping[str, Iterable[StreamId]]) -> dict[str, StreamId]:
    """Of ``doc -> ids`` this process read or appended, the documents whose
    stream lost one of them, each with its last id now. An id at or below
    the trim mark is kept (GC folded it into the snapshot). Raises when a
    node cannot be reached (the caller asks again after its backoff); a
    document Redis refuses to read (a key of the wrong type) is skipped.

    One pipeline per :data:`PAGE` documents (in a cluster, each node gets its
    documents' share): per document an ``XRANGE id id`` per id, then the trim
    mark and the last id, read after the entries, so a trim in between
    cannot look like a loss."""
    checked = {doc: sorted({entry_id for entry_id in ids if entry_id > ZERO}) for doc, ids in seen.items()}
    docs = [doc for doc, ids in checked.items() if ids]
    rewound: dict[str, StreamId] = {}
    for start in range(0, len(docs), PAGE):
        rewound.update(await _check_page(redis, {doc: checked[doc] for doc in docs[start : start + PAGE]}))
    return rewound


async def _check_page(redis: Any, checked: dict[str, list[StreamId]]) -> dict[str, StreamId]:
    async with redis.pipeline(transaction=False) as pipe:
        for doc, ids in checked.items():
            for entry_id in ids:
                pipe.xrange(stream_key(doc), min=str(entry_id), max=str(entry_id), count=1)
            pipe.hmget(meta_key(doc), "trimmed_through", "last_id")
        replies = iter(await pipe.execute(raise_on_error=False))
    rewound: dict[str, StreamId] = {}
    for doc, ids in checked.items():
        answers = [next(replies) for _ in range(len(ids) + 1)]
        if failed := [answer for answer in answers if isinstance(answer, Exception)]:
            if isinstance(failed[0], UNREACHABLE):
                raise failed[0]
            continue  # the document's keys are broken: the fan-out sets it aside when it reads it
        raw_trimmed, raw_last = answers[-1]
        trimmed = stream_id(raw_trimmed) or ZERO
        if any(not held and entry_id > trimmed for entry_id, held in zip(ids, answers[:-1], strict=True)):
            rewound[doc] = stream_id(raw_last) or ZERO
    return rewound


__all__ = ["PAGE", "find_rewound"]
