"""Announcing appends: the write side of the reader loop's wake-ups
(:mod:`yrelay.storage.reader` reads them).

- **One Redis.** Every append batch ends with one entry on the capped change
  stream (``yrelay:changes``, field ``d``: the documents, newline-separated),
  queued by :func:`announce_in` on the batch's own pipeline after the
  appends: Redis runs a pipeline's commands in order, so whoever reads the
  announcement finds the entries it names.
- **A Redis Cluster** refuses a multi-key XREAD across slots: after each
  append batch the appender adds one entry to the change stream of each
  bucket the batch touched (:func:`announce_buckets`: ``yrelay:{bucket:NN}:changes``),
  *after* the batch's pipeline answered, so the entries are in the
  documents' streams before anyone is woken.

An announcement lost (Redis failed, a server of an older version, a write
by hand) costs only latency: the reader loop's sweep reads every document
within ``block_ms``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT

from yrelay.storage.client import is_cluster
from yrelay.storage.keys import bucket_changes_key, changes_key
from yrelay.storage.listing import by_bucket
from yrelay.storage.packed import CommandQueue
from yrelay.storage.replies import text
from yrelay.tasks import lost_redis

log = logging.getLogger(__name__)

#: Entries the change stream keeps (approximately): a reader further behind
#: than this has the sweep to catch it up. An entry names every document of
#: one append batch (hundreds under load: a few kB), so a few seconds of
#: batches, not minutes.
CHANGES_MAXLEN = 1_000
#: Entries a bucket's change stream keeps (approximately): a watcher that
#: falls further behind has the sweep to catch it up.
BUCKET_CHANGES_MAXLEN = 10_000


def announcement(docs: list[str]) -> dict[str, str]:
    """The fields of a change-stream entry naming ``docs`` (the change
    stream and a cluster's bucket streams). Document ids hold no newline
    (:data:`yrelay.storage.keys.DOC_ID_PATTERN`)."""
    return {"d": "\n".join(docs)}


def announced(fields: Mapping[bytes, bytes]) -> list[str]:
    """The documents a change-stream entry names."""
    return text(fields.get(b"d", b"")).split("\n")


def announce_in(pipe: CommandQueue, docs: list[str]) -> None:
    """Queue the announcement of an append to ``docs`` on ``pipe``, after
    the appends (nothing on a cluster: :func:`announce_buckets`)."""
    if docs and not is_cluster(pipe):
        [(field, value)] = announcement(docs).items()
        pipe.execute_command("XADD", changes_key(), "MAXLEN", "~", CHANGES_MAXLEN, "*", field, value)


async def announce(redis: Redis, docs: list[str]) -> None:
    """Announce ``docs`` on their own (after a write outside an append
    batch; nothing on a cluster). Never raises: the write is done, and an
    announcement lost is delivered by the next sweep."""
    if not is_cluster(redis) and docs:
        await _announce(redis, docs, cluster=False)


async def announce_buckets(client: Redis, docs: list[str]) -> None:
    """On a cluster: wake the readers of ``docs`` (just appended to) in
    every process, one entry per bucket. Never raises, like :func:`announce`."""
    await _announce(client, docs, cluster=True)


async def _announce(client: Redis, docs: list[str], *, cluster: bool) -> None:
    try:
        async with client.pipeline(transaction=False) as pipe:
            if cluster:
                for bucket, members in by_bucket(docs).items():
                    fields: dict[FieldT, EncodableT] = {name: value for name, value in announcement(members).items()}
                    pipe.xadd(bucket_changes_key(bucket), fields, maxlen=BUCKET_CHANGES_MAXLEN, approximate=True)
            else:
                announce_in(pipe, docs)
            await pipe.execute()
    except Exception as exc:  # the sweep delivers them within block_ms
        if not lost_redis(exc):
            raise
        log.warning("could not announce appends to %d documents (%s); the next sweep delivers them", len(docs), exc)


__all__ = [
    "BUCKET_CHANGES_MAXLEN",
    "CHANGES_MAXLEN",
    "announce",
    "announce_buckets",
    "announce_in",
    "announced",
    "announcement",
]
