"""The process's subscriptions, by document: whom the fan-out feeds, and
the one registry through which an eviction reaches the subscriptions.

An ack the tracker refuses because GC (or an operator) evicted the session
comes back from the ack writer as ``on_evicted(doc, session)``, which is
:meth:`SubscriptionRegistry.session_evicted`: the registry tells that
session's subscriptions to this document, which then require a resync. The
registry is built before the ack writer and the fan-out, and both get it at
construction: the fan-out offers batches to the same subscriptions eviction
reaches. The registry calls back only through :class:`Member`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class Member(Protocol):
    """What the registry needs of a subscription."""

    doc: str
    session: str

    def evicted(self) -> None:
        """The tracker no longer holds this session (an ack found it gone)."""


M = TypeVar("M", bound=Member)


class SubscriptionRegistry(Generic[M]):
    """This process's subscriptions, by document."""

    def __init__(self) -> None:
        self._by_doc: dict[str, set[M]] = {}

    def add(self, member: M) -> None:
        self._by_doc.setdefault(member.doc, set()).add(member)

    def discard(self, member: M) -> bool:
        """Forget ``member``; True when its document has no subscription left."""
        members = self._by_doc.get(member.doc)
        if members is None or member not in members:
            return False
        members.discard(member)
        if not members:
            del self._by_doc[member.doc]
            return True
        return False

    def of(self, doc: str) -> list[M]:
        """The document's subscriptions (a copy: callbacks may unregister)."""
        return list(self._by_doc.get(doc, ()))

    def session_evicted(self, doc: str, session: str) -> None:
        """The ack writer's ``on_evicted``: tell this process's subscriptions
        of ``session`` to ``doc`` that the tracker dropped them."""
        for member in self.of(doc):
            if member.session == session:
                member.evicted()

    def __iter__(self) -> Iterator[M]:
        return (member for members in list(self._by_doc.values()) for member in members)

    def __len__(self) -> int:
        return sum(len(members) for members in self._by_doc.values())


__all__ = ["Member", "SubscriptionRegistry"]
