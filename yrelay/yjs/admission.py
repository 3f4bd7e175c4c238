"""Causal admission: store an update only when the document can apply it.

Yjs integrates one client's structs only in clock order, and an item only
once what it refers to (origin, right origin, parent) is there. An update
stored behind a gap is stored but never in the document: not in any replica,
not in GC's snapshot. ``appended`` promises the user the edit is safe, so the
server checks every update against the document's *state vector* (the next
clock of every Yjs client it holds) before the append script stores it.

The state vector lives in Redis beside the stream (``keys.clocks_key``) and
is changed by the same script that appends (``lua/append.lua``), so server
processes agree and a crash cannot split the two. This module is the pure
part: what an update needs (:func:`needs_of`), whether a state vector
satisfies it (:func:`missing`), an update read as the write path reads
it (:func:`read_for_storing`), the causally ready part of a diff
(:func:`ready_part`), and a state vector rebuilt from stored updates
(:class:`StateBuilder`, for documents stored before admission existed).

Deletions never block an update: Yjs keeps a deletion of content it does not
hold yet as a pending delete set and applies it when the content arrives.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from yrelay.yjs import update_format
from yrelay.yjs.update_format import Layout, MalformedUpdate, Ranges, merge_ranges

Clocks = dict[int, int]  # Yjs client id -> the next clock the document expects

#: Yjs clients one update may involve: the append script reads the
#: document's clock of each (a state vector this long is ~1 MB; 100,000
#: reads keep Redis busy ~50 ms).
MAX_CLIENTS = 100_000


class InconsistentUpdate(MalformedUpdate):
    """The update's own structs refer to each other in a way no Yjs encoder
    writes (a cycle, or content after a gap of its own): no replica could
    ever apply it, whatever the document holds."""


@dataclass(frozen=True)
class Needs:
    """What a document must hold for an update to apply.

    ``ranges``: per client, the update's struct ranges in clock order; each
    must start at or below the document's clock once the earlier ones are
    counted. ``refs``: per client, the highest clock referred to; it must be
    below the document's clock once the update's own ranges are counted.
    """

    ranges: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    refs: dict[int, int] = field(default_factory=dict)

    def script_args(self) -> list[int]:
        """``n, (client, start, end)*n, m, (client, max ref)*m`` for ``append.lua``."""
        ranges = [(client, start, end) for client, spans in self.ranges.items() for start, end in spans]
        return [len(ranges), *itertools.chain(*ranges), len(self.refs), *itertools.chain(*self.refs.items())]


def needs_of(layout: Layout) -> Needs:
    """The needs of a whole update; raises :class:`InconsistentUpdate` when
    its structs could not apply even on a document holding everything before
    each of its sections (so the summary is exact: see the module doc)."""
    if not _plainly_ordered(layout):
        assumed: Clocks = {}
        for section in layout.sections:
            if section.structs:
                first = section.structs[0].clock
                assumed[section.client] = min(assumed.get(section.client, first), first)
        kept = _ready_prefixes(layout, assumed, skips_held=True)
        if any(kept.get(index, 0) != len(section.structs) for index, section in enumerate(layout.sections)):
            raise InconsistentUpdate("the update's structs refer to content it does not carry in order")
    ranges: dict[int, list[tuple[int, int]]] = {}
    refs: dict[int, int] = {}
    for section in layout.sections:
        spans = ranges.setdefault(section.client, [])
        for struct in section.structs:
            if not struct.skip and struct.length:
                spans.append((struct.clock, struct.clock + struct.length))
            for client, clock in struct.refs:
                refs[client] = max(refs.get(client, -1), clock)
    if len(ranges) + len(refs) > MAX_CLIENTS:  # the append script reads one field per client
        raise MalformedUpdate(f"an update involving more than {MAX_CLIENTS:,} Yjs clients")
    return Needs({client: merge_ranges(spans) for client, spans in ranges.items() if spans}, refs)


@dataclass(frozen=True, slots=True)
class Reading:
    """An update as the server stores it, its structs and its needs."""

    update: bytes
    layout: Layout
    needs: Needs


def read_for_storing(update: bytes) -> Reading:
    """``update`` as the server's write path reads it: strictly
    (``read_layout(strict=True)``: nothing Yjs cannot decode), in the form
    it is stored (without the structs of length 0 and empty delete ranges
    Yjs throws on: :func:`update_format.stored_form`), with that form's
    layout (its known-safe shape decided) and needs. Raises :class:`MalformedUpdate`
    (:class:`InconsistentUpdate` included)."""
    layout = update_format.read_layout(update, strict=True, decide=True)
    stored = update_format.stored_form(update, layout)
    if stored is not update:
        layout = update_format.read_layout(stored, decide=True)
    return Reading(stored, layout, needs_of(layout))


def _plainly_ordered(layout: Layout) -> bool:
    """The common case, decided without the fixpoint: one client's structs
    (a local edit), no Skip, each referring only to other clients or to its
    own earlier clocks."""
    if len(layout.sections) != 1:
        return False
    section = layout.sections[0]
    for struct in section.structs:
        if struct.skip:
            return False
        for client, clock in struct.refs:
            if client == section.client and clock >= struct.clock:
                return False
    return True


def missing(needs: Needs, clocks: Mapping[int, int]) -> Clocks:
    """The clients whose content ``needs`` lacks in a document at ``clocks``,
    each with the document's clock; empty when the update can be admitted.
    (The Python twin of the check in ``lua/append.lua``.)"""
    after = dict(clocks)
    lacking: Clocks = {}
    for client, spans in needs.ranges.items():
        for start, end in spans:
            current = after.get(client, 0)
            if start > current:
                lacking[client] = clocks.get(client, 0)
                break
            after[client] = max(current, end)
    for client, clock in needs.refs.items():
        if clock >= after.get(client, 0):
            lacking[client] = clocks.get(client, 0)
    return lacking


def advance(clocks: Clocks, needs: Needs) -> None:
    """Count an admitted update's ranges in ``clocks``."""
    for client, spans in needs.ranges.items():
        clocks[client] = max(clocks.get(client, 0), max(end for _, end in spans))


@dataclass(frozen=True)
class Part:
    """The causally ready part of an update, and what was left out."""

    update: bytes | None  # None: nothing (no struct, no deletion) is ready
    needs: Needs
    #: Per client, the ``[start, end)`` struct ranges left out.
    dropped: Ranges


def ready_part(update: bytes, layout: Layout, clocks: Mapping[int, int]) -> Part:
    """What of ``update`` a document at ``clocks`` can apply: for each client
    the longest run of structs from its first whose start and refs the
    document (or the kept structs) holds. Deletions are always kept."""
    kept = _ready_prefixes(layout, dict(clocks), skips_held=False)
    dropped: Ranges = {}
    for index, section in enumerate(layout.sections):
        count = kept.get(index, 0)
        while count and section.structs[count - 1].skip:  # a trailing skip carries nothing
            count -= 1
        kept[index] = count
        left = [(s.clock, s.clock + s.length) for s in section.structs[count:] if not s.skip and s.length]
        if left:
            dropped.setdefault(section.client, []).extend(left)
    dropped = {client: merge_ranges(spans) for client, spans in dropped.items()}
    if not any(kept.values()) and not layout.deletes:
        return Part(None, Needs(), dropped)
    part = update_format.encode_part(update, layout, kept) if dropped else update
    return Part(part, needs_of(update_format.read_layout(part)), dropped)


def _ready_prefixes(layout: Layout, clocks: Clocks, *, skips_held: bool) -> dict[int, int]:
    """Integrate structs the way Yjs does, to a fixpoint: section ``i``'s
    next struct goes in when it starts at or below its client's clock and
    every id it refers to is below its client's clock. With ``skips_held``,
    the content a Skip leaves out is taken as held (the internal check) and
    clients the update does not carry are held in full.

    A blocked section waits in a heap under the one (client, clock) that
    stops it and is woken only when that client's clock gets there, so a
    hostile chain of sections costs O(n log n), not a pass per link."""
    carried = {section.client for section in layout.sections} if skips_held else None
    kept = [0] * len(layout.sections)
    waiting: dict[int, list[tuple[int, int]]] = {}  # client -> heap of (clock it must reach, section)
    work = list(range(len(layout.sections) - 1, -1, -1))
    while work:
        index = work.pop()
        section = layout.sections[index]
        before = clocks.get(section.client, 0)
        while kept[index] < len(section.structs):
            struct = section.structs[kept[index]]
            stop = _stop(struct, section.client, clocks, carried)
            if stop is not None:
                heapq.heappush(waiting.setdefault(stop[0], []), (stop[1], index))
                break
            if not struct.skip or skips_held:
                clocks[section.client] = max(clocks.get(section.client, 0), struct.clock + struct.length)
            kept[index] += 1
        reached = clocks.get(section.client, 0)
        if reached != before:
            heap = waiting.get(section.client, [])
            while heap and heap[0][0] <= reached:
                work.append(heapq.heappop(heap)[1])
    return dict(enumerate(kept))


def _stop(struct: update_format.Struct, client: int, clocks: Clocks, only: set[int] | None) -> tuple[int, int] | None:
    """What keeps ``struct`` (of ``client``) out: the (client, clock) the
    document must reach first; None when it can go in. With ``only``, ids of
    clients outside it are taken as held (the update does not carry them)."""
    if struct.clock > clocks.get(client, 0):
        return client, struct.clock
    for ref_client, ref_clock in struct.refs:
        if only is not None and ref_client not in only:
            continue
        if ref_clock >= clocks.get(ref_client, 0):
            return ref_client, ref_clock + 1
    return None


@dataclass
class Blocked:
    """A stored entry the document cannot apply (stored before admission)."""

    entry_id: str
    #: Clients whose content it lacks, each with the document's clock.
    missing: Clocks


class StateBuilder:
    """The state vector of a document rebuilt from what is stored (snapshot,
    then stream entries in order), integrating as Yjs does: the ready part
    of each entry goes in, the rest waits and is retried when the state
    reaches what it waits for.

    Each waiting entry is filed under the one (client, clock) that stops it
    (a heap per client), so a retry happens only when that client's clock
    gets there: near-linear in the entries, even in reverse order.

    Entries with structs still waiting at the end are :attr:`blocked`:
    stored, but not in any replica's document (GC reports them; see
    docs/operations.md)."""

    def __init__(self, clocks: Mapping[int, int] | None = None):
        self.clocks: Clocks = dict(clocks or {})
        self._layouts: dict[str, Layout | None] = {}  # waiting entries
        self._heaps: dict[int, list[tuple[int, int, str]]] = {}  # client -> (clock needed, order, entry)
        self._order = 0

    def add(self, entry_id: str, update: bytes) -> None:
        try:
            layout: Layout | None = update_format.read_layout(update)
        except MalformedUpdate:
            layout = None  # never applicable: reported as blocked
        self._layouts[entry_id] = layout
        self._settle([entry_id])

    def _settle(self, work: list[str]) -> None:
        """Integrate ``work`` and whatever their progress unblocks."""
        while work:
            entry_id = work.pop()
            layout = self._layouts[entry_id]
            if layout is None:
                continue
            before = dict(self.clocks)
            kept = _ready_prefixes(layout, self.clocks, skips_held=False)
            stop = _first_stop(layout, kept, self.clocks)
            if stop is None:
                del self._layouts[entry_id]
            else:
                self._order += 1
                heapq.heappush(self._heaps.setdefault(stop[0], []), (stop[1], self._order, entry_id))
            for client, clock in self.clocks.items():
                if clock != before.get(client, 0):
                    heap = self._heaps.get(client, [])
                    while heap and heap[0][0] <= clock:
                        woken = heapq.heappop(heap)[2]
                        if woken in self._layouts:
                            work.append(woken)

    @property
    def blocked(self) -> list[Blocked]:
        found = []
        for entry_id, layout in self._layouts.items():
            wanted: Clocks = {}
            for section in layout.sections if layout is not None else ():
                for struct in section.structs:
                    if struct.clock > self.clocks.get(section.client, 0):
                        wanted[section.client] = self.clocks.get(section.client, 0)
                    wanted.update({c: self.clocks.get(c, 0) for c, k in struct.refs if k >= self.clocks.get(c, 0)})
            found.append(Blocked(entry_id, wanted))
        return found


def _first_stop(layout: Layout, kept: dict[int, int], clocks: Clocks) -> tuple[int, int] | None:
    """The (client, clock the document must reach) that stops the first
    section not fully integrated; None when every struct is in."""
    for index, section in enumerate(layout.sections):
        if kept.get(index, 0) < len(section.structs):
            return _stop(section.structs[kept[index]], section.client, clocks, None)
    return None
