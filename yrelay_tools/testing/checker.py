"""The delivery checker: did every acked update reach everybody, and did
everybody converge?

Used by the core tests and meant for the fault suite: give it the updates the
server acknowledged and the final documents of every live client (and,
optionally, the server's own snapshot + stream), and it either returns a
report or raises :class:`DeliveryViolation` naming what is missing where.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from yrelay.yjs import crdt, update_format


class DeliveryViolation(AssertionError):
    """An acked update is missing somewhere, or replicas diverged."""


@dataclass
class CheckReport:
    replicas: int
    acked_updates: int
    content: str
    missing: dict[str, int] = field(default_factory=dict)


def check_delivery(
    replicas: Mapping[str, crdt.Doc],
    acked_updates: Iterable[bytes],
    content: Callable[[crdt.Doc], str] = crdt.text_of,
) -> CheckReport:
    """Assert every acked update is in every replica, and all replicas agree.

    ``replicas`` maps a name (``"client-3"``, ``"server"``) to its final
    document for one Yjs document.
    """
    acked = list(acked_updates)
    decoded = decode_updates(acked)
    missing: dict[str, int] = {}
    for name, doc in replicas.items():
        absent = len(missing_updates(doc, decoded))
        if absent:
            missing[name] = absent
    contents = {name: content(doc) for name, doc in replicas.items()}
    distinct = set(contents.values())
    problems = []
    if missing:
        problems.append(f"acked updates missing: {missing} (of {len(acked)})")
    if len(distinct) > 1:
        sample = {name: text[:80] for name, text in contents.items()}
        problems.append(f"replicas diverged into {len(distinct)} versions: {sample}")
    if problems:
        raise DeliveryViolation("; ".join(problems))
    return CheckReport(len(replicas), len(acked), next(iter(distinct), ""), missing)


def _decode(update: bytes) -> update_format.Coverage | None:
    try:
        return update_format.decode(update)
    except update_format.MalformedUpdate:
        return None


def decode_updates(updates: Iterable[bytes]) -> list[update_format.Coverage | None]:
    """Decode once what is checked against many documents (None: undecodable)."""
    return [_decode(update) for update in updates]


def missing_updates(doc: crdt.Doc, decoded: list[update_format.Coverage | None]) -> list[int]:
    """Indexes of the updates (from :func:`decode_updates`) that ``doc`` does not
    fully hold: the same test as :func:`yrelay.yjs.crdt.contains`, with the
    document encoded and decoded once instead of once per update."""
    return missing_from_state(crdt.encode_state(doc), decoded)


def absent_ranges(state: bytes, part: update_format.Coverage) -> update_format.Ranges:
    """What of ``part`` a document (its encoded ``state``) lacks, as
    ``client -> [start, end)`` clock ranges, inserts and deletes together:
    the words a violation names a lost update in."""
    whole = update_format.decode(state)
    absent: update_format.Ranges = {}
    for mine, theirs in ((part.structs, whole.structs), (part.deletes, whole.deletes)):
        for client, ranges in mine.items():
            held = theirs.get(client, [])
            for start, end in ranges:
                if not any(lo <= start and end <= hi for lo, hi in held):
                    absent.setdefault(client, []).append((start, end))
    return absent


def missing_from_state(state: bytes, decoded: list[update_format.Coverage | None]) -> list[int]:
    """:func:`missing_updates` against an encoded document: no y-py object is
    touched, so it may run in a worker thread (y-py documents may not)."""
    whole = update_format.decode(state)
    return [index for index, part in enumerate(decoded) if part is None or not update_format.covers(whole, part)]
