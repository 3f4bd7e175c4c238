"""Checking a client's whole subscription set against the server's.

The client sends the digest (count + XOR of xxh3_128) of the documents it is
subscribed to; the server answers with the digest of the documents whose
tracker still holds the session. Equal: done, one round trip. Different
(GC evicted the session from a document, an unsubscribe was lost, the server
lost state): range-based reconciliation (:mod:`yrelay.reconciliation`)
finds exactly which documents differ, in a few round trips, and the client
re-creates the missing subscriptions (with a resync) and removes the extra
ones.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from yrelay import protocol
from yrelay.reconciliation import Digest, MemoryIdSet, Reconciler

#: Sends a frame and returns the server's answer (the frame with the given op).
Request = Callable[[dict[str, Any], str], Awaitable[dict[str, Any]]]


@dataclass
class SubscriptionCheck:
    """What one check found; ``round_trips`` counts the digest exchange too."""

    missing: list[str] = field(default_factory=list)  # subscribed here, not tracked there
    extra: list[str] = field(default_factory=list)  # tracked there, not subscribed here
    round_trips: int = 1
    bytes_sent: int = 0
    bytes_received: int = 0

    @property
    def in_sync(self) -> bool:
        return not self.missing and not self.extra


async def compare_subscriptions(documents: list[str], request: Request) -> SubscriptionCheck:
    """Find the difference between ``documents`` and the server's set."""
    local = MemoryIdSet(documents)
    ours = await local.digest()
    answer = await request({"op": "check_subscriptions", **ours.to_wire()}, "subscriptions")
    theirs = Digest.from_wire({"count": answer["count"], "hash": answer["hash"]})
    check = SubscriptionCheck()
    if theirs == ours:
        return check
    reconciler = Reconciler(local, theirs)
    message = await reconciler.start()
    while message is not None:
        check.round_trips += 1
        check.bytes_sent += len(message)
        replied = await request({"op": "reconcile", "payload": protocol.b64encode(message)}, "reconcile_reply")
        reply = protocol.b64decode(replied["payload"])
        check.bytes_received += len(reply)
        message = await reconciler.step(reply)
    check.missing, check.extra = reconciler.only_local, reconciler.only_remote
    return check
