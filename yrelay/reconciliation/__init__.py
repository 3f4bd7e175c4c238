"""Set reconciliation: detect drift between two sets of ids with a digest
(count + XOR of xxh3_128), then find exactly what differs with range-based
reconciliation. Independent of websockets: messages are bytes.
"""

from __future__ import annotations

from yrelay.reconciliation.digest import Digest, DigestSet, digest_of, hash_hex, item_hash
from yrelay.reconciliation.messages import MalformedMessage
from yrelay.reconciliation.protocol import FULL_LIST_FRACTION, Limits, Reconciler, ReconciliationError, respond
from yrelay.reconciliation.redis_idset import RedisIdSet
from yrelay.reconciliation.storage import IdSet, MemoryIdSet, Range

__all__ = [
    "FULL_LIST_FRACTION",
    "Digest",
    "DigestSet",
    "IdSet",
    "Limits",
    "MalformedMessage",
    "MemoryIdSet",
    "Range",
    "Reconciler",
    "ReconciliationError",
    "RedisIdSet",
    "digest_of",
    "hash_hex",
    "item_hash",
    "respond",
]
