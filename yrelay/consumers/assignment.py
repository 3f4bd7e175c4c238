"""Which member of a group reads which document: balanced and sticky.

Pure: the leader (:mod:`yrelay.consumers.leader`) calls :func:`assign` with
the documents, the live members and the current assignment, and writes only
the documents whose member changed. Balanced: every member gets ``n // m`` or
one more. Sticky: a document stays with its member while that member is
alive and within its share, so a rebalance moves as few documents as it can
(each move costs a claim and, for the documents a dead member had not
acked, duplicates).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def assign(docs: Sequence[str], members: Sequence[str], current: Mapping[str, str]) -> dict[str, str]:
    """Document -> member for every document (empty when there is no member)."""
    if not members:
        return {}
    kept: dict[str, list[str]] = {member: [] for member in members}
    for doc in docs:
        owner = current.get(doc)
        if owner in kept:
            kept[owner].append(doc)
    base, extra = divmod(len(docs), len(members))
    # The members already holding the most keep the larger shares: fewer moves.
    ranked = sorted(members, key=lambda member: (-len(kept[member]), member))
    share = {member: base + (1 if rank < extra else 0) for rank, member in enumerate(ranked)}
    result: dict[str, str] = {}
    free: list[str] = []
    for member in members:
        keep, spill = kept[member][: share[member]], kept[member][share[member] :]
        result.update(dict.fromkeys(keep, member))
        free.extend(spill)
    free.extend(doc for doc in docs if current.get(doc) not in kept)
    open_slots = [member for member in ranked for _ in range(share[member] - len(kept[member][: share[member]]))]
    for doc, member in zip(sorted(free), open_slots, strict=False):
        result[doc] = member
    return result


def changes(new: Mapping[str, str], current: Mapping[str, str]) -> dict[str, str]:
    """What the leader writes: moved or new documents -> member, gone ones -> ''."""
    moved = {doc: member for doc, member in new.items() if current.get(doc) != member}
    moved.update({doc: "" for doc in current if doc not in new})
    return moved
