"""Range-based set reconciliation: the server's answer and the client's
state machine, both sans-IO (bytes in, bytes out).

After a digest mismatch the client asks about ranges of the sorted id space.
For each mismatched range, whoever learns of the mismatch splits it into
:data:`BRANCHING` parts of about equal size and sends their fingerprints; the
other side compares them with its own and answers only for the parts that
differ. A range of at most :data:`LEAF` ids is not split but listed. Both
directions split, so every message goes one level down: a million ids and
one difference take three round trips (16, 16, 16 fingerprints, then a
leaf). All ranges of a round travel in one message.

The server answers each request on its own (no state between messages) and
within :class:`Limits`; the client keeps what is open and asks again for
whatever an answer did not reach. When a range looks so different that
fingerprints would cost more than its ids (``full_list_fraction``, chosen by
measurement: see docs/reconciliation.md), the client asks for its ids.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import reduce

from yrelay.reconciliation.digest import Digest, xor_hashes
from yrelay.reconciliation.messages import (
    MAX_ID_BYTES,
    REPLY_MODES,
    REQUEST_MODES,
    Encoder,
    Entry,
    MalformedMessage,
    Message,
    Mode,
    decode,
    fingerprint,
    id_sizes,
)
from yrelay.reconciliation.storage import WHOLE, IdSet, Range, separator

#: Parts per split. 16 keeps one difference among a million ids under 1 KB
#: (four rounds of 16 fingerprints, then a 16-id leaf) in three round trips.
BRANCHING = 16
#: A range holding at most this many ids is listed instead of split.
LEAF = 16
#: Ask for a range's ids once its count difference is at least this
#: fraction of its size (see docs/reconciliation.md for the measurement).
FULL_LIST_FRACTION = 0.03


@dataclass(frozen=True)
class Limits:
    """Per-message bounds, enforced by the server and respected by the
    client. The defaults keep a message, base64-encoded inside a JSON frame,
    under yrelay's 1.5 MB frame limit."""

    max_request_bytes: int = 1 << 20
    max_request_ranges: int = 16_384
    max_reply_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.max_request_ranges < 2 * BRANCHING or min(self.max_request_bytes, self.max_reply_bytes) < 1 << 16:
            raise ValueError("limits too small to guarantee progress")


#: The default bounds (a frozen value, shared as every call's default).
DEFAULT_LIMITS = Limits()


class ReconciliationError(RuntimeError):
    """The differences found do not account for the digests (a set changed
    during the run, or the peer misbehaved): run detection again."""


# -- server --------------------------------------------------------------------


async def respond(store: IdSet, request: bytes, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """The server's answer to one request: stateless, bounded by ``limits``.

    FINGERPRINT ranges that match are left out; mismatched ones are answered
    with their ids (at most :data:`LEAF`) or with :data:`BRANCHING` part
    fingerprints; LIST ranges with their ids. The reply always ends with the
    bound it reached (+inf when complete); it stops early, after a whole entry
    or inside a LIST, at ``max_reply_bytes``, and the client asks again for
    the rest. Raises MalformedMessage for an invalid request."""
    if len(request) > limits.max_request_bytes:
        raise MalformedMessage("request larger than max_request_bytes")
    entries = decode(request, REQUEST_MODES, limits.max_request_ranges).entries
    spans = [(entry.lower, entry.upper) for entry in entries]
    counts = await store.counts(spans)
    planned = _affordable(entries, counts, limits.max_reply_bytes)
    small = [i for i in range(planned) if entries[i].mode == Mode.LIST or counts[i] <= LEAF]
    large = sorted(set(range(planned)).difference(small))
    ids = dict(zip(small, await store.items([spans[i] for i in small], LIST_READ), strict=True))
    parts = dict(zip(large, await store.parts([spans[i] for i in large], BRANCHING), strict=True))
    encoder = Encoder()
    for index in range(planned):
        entry, mark, reached = entries[index], encoder.mark(), None
        if entry.mode == Mode.LIST:
            room = limits.max_reply_bytes - len(encoder) - _HEAD_ROOM
            page = await _page(store, entry, ids[index], counts[index], room)
            reached = _list(encoder, entry, page, counts[index], room)
        elif index in ids:
            ours = ids[index]
            if not _matches(entry, Digest(len(ours), xor_hashes(ours))):
                encoder.ids(entry.lower, entry.upper, ours)
        elif not _matches(entry, _union([part.digest for part in parts[index]])):
            for part in parts[index]:
                encoder.fingerprint(part.lower, part.upper, part.digest.count, part.digest.hash)
        if len(encoder) > limits.max_reply_bytes:
            encoder.rollback(mark)
            return encoder.finish_at(entry.lower)
        if reached is not None:
            return encoder.finish_at(reached)
    return encoder.finish_at(None if planned == len(entries) else entries[planned].lower)


def _affordable(entries: list[Entry], counts: list[int], max_bytes: int) -> int:
    """How many entries are worth reading for one reply: stop once even the
    smallest answers (2 bytes an id, 11 a fingerprint) would overflow it."""
    spent = 0
    for index, (entry, count) in enumerate(zip(entries, counts, strict=True)):
        if spent > max_bytes:
            return index
        spent += 11 * BRANCHING if entry.mode == Mode.FINGERPRINT and count > LEAF else 2 * count + 2
    return len(entries)


def _union(digests: list[Digest]) -> Digest:
    """The digest of the union of disjoint sets."""
    return Digest(sum(digest.count for digest in digests), reduce(operator.xor, (digest.hash for digest in digests), 0))


def _matches(entry: Entry, ours: Digest) -> bool:
    return entry.count == ours.count and entry.fingerprint == fingerprint(ours.hash)


#: Ids of each LIST range read up front (all ranges in one store call); a
#: longer range is read on as its page fills.
LIST_READ = 4_096
#: Room kept for an IDS entry's head: a SKIP and a bound (each at most an id
#: long) and the count.
_HEAD_ROOM = 2 * MAX_ID_BYTES + 32


async def _page(store: IdSet, entry: Entry, ids: list[str], count: int, room: int) -> list[str]:
    """``ids`` (the first :data:`LIST_READ` of the range) read on until they
    fill ``room`` bytes or the range ends, in reads sized by the ids so far."""
    sizes = id_sizes(entry.lower, ids, room)
    while ids and len(ids) < count and sizes[-1] <= room:
        want = int((room - sizes[-1]) * len(ids) / sizes[-1]) + 2  # +1 past the page, for its bound
        more = (await store.items([(ids[-1] + "\0", entry.upper)], want))[0]
        if not more:  # the set shrank since it was counted
            break
        ids = ids + more
        sizes = id_sizes(entry.lower, ids, room)
    return ids


def _list(encoder: Encoder, entry: Entry, ids: list[str], count: int, room: int) -> str | None:
    """Add ``entry``'s ids, or if they do not all fit in ``room`` bytes (or
    are not all there), as many as fit as a page ``[lower, cut)``. Returns
    how far the reply got: None when the whole range went out, else the cut
    (``entry.lower`` when not even one id fits)."""
    sizes = id_sizes(entry.lower, ids, room)
    if len(ids) == count and (count == 0 or sizes[-1] <= room):
        encoder.ids(entry.lower, entry.upper, ids)
        return None
    fit = min(len(ids) - 1, bisect.bisect_right(sizes, room))
    if fit < 1:
        return entry.lower
    cut = separator(ids[fit - 1], ids[fit])
    encoder.ids(entry.lower, cut, ids[:fit])
    return cut


# -- client --------------------------------------------------------------------


class State(Enum):
    READY = "ready"  # start() not called yet
    WAITING = "waiting"  # a request is out; step() takes its reply
    DONE = "done"  # only_local / only_remote are final and checked
    FAILED = "failed"  # a call raised; start again with a new Reconciler


@dataclass(slots=True)
class _Ask:
    """A range the client asks about: FINGERPRINT (with its local digest,
    None until computed) or LIST."""

    lower: str
    upper: str | None
    mode: Mode
    digest: Digest | None = None


class Reconciler:
    """The client side: finds ``only_local`` (ids the client has and the
    server lacks) and ``only_remote`` (the reverse), sorted.

    ``await start()`` gives the first request (None when the digests already
    match); each ``await step(reply)`` gives the next request, or None when
    done. ``local`` must not change during the run; at the end the result is
    checked against ``remote`` (the server's digest, from the drift check) and
    ReconciliationError says the sets moved meanwhile."""

    def __init__(
        self,
        local: IdSet,
        remote: Digest,
        *,
        limits: Limits = DEFAULT_LIMITS,
        full_list_fraction: float = FULL_LIST_FRACTION,
        max_round_trips: int = 256,
    ):
        self.local = local
        self.remote = remote
        self.limits = limits
        self.full_list_fraction = full_list_fraction
        self.max_round_trips = max_round_trips
        self.state = State.READY
        self.round_trips = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self._queue: list[_Ask] = []
        self._pending: list[_Ask] = []
        self._only_local: list[str] = []
        self._only_remote: list[str] = []

    @property
    def only_local(self) -> list[str]:
        self._expect(State.DONE)
        return self._only_local

    @property
    def only_remote(self) -> list[str]:
        self._expect(State.DONE)
        return self._only_remote

    def _expect(self, state: State) -> None:
        if self.state is not state:
            raise RuntimeError(f"reconciler is {self.state.value}, not {state.value}")

    async def start(self) -> bytes | None:
        """The first request, or None when there is nothing to ask."""
        self._expect(State.READY)
        try:
            ours = await self.local.digest()
            if ours != self.remote:
                await self._differs([(WHOLE, self.remote.count, ours.count)])
            return await self._next()
        except BaseException:
            self.state = State.FAILED
            raise

    async def step(self, reply: bytes) -> bytes | None:
        """Take the server's reply; the next request, or None when done.
        MalformedMessage for an invalid reply, ReconciliationError when the
        result does not check out or the run takes too many round trips;
        after either, the reconciler is FAILED."""
        self._expect(State.WAITING)
        try:
            return await self._step(reply)
        except BaseException:
            self.state = State.FAILED
            raise

    async def _step(self, reply: bytes) -> bytes | None:
        self.round_trips += 1
        self.bytes_received += len(reply)
        if len(reply) > self.limits.max_reply_bytes:
            raise MalformedMessage("reply larger than max_reply_bytes")
        message = decode(reply, REPLY_MODES, self.limits.max_reply_bytes)
        if message.end == "":
            raise MalformedMessage("a reply must make progress")
        await self._absorb(message)
        if self.round_trips >= self.max_round_trips and self._queue:
            raise ReconciliationError(f"not done after {self.round_trips} round trips")
        return await self._next()

    async def _absorb(self, message: Message) -> None:
        ids = [entry for entry in message.entries if entry.mode == Mode.IDS]
        prints = [entry for entry in message.entries if entry.mode != Mode.IDS]
        _check_inside(message.entries, self._pending)
        for entry, ours in zip(ids, await self.local.items([(e.lower, e.upper) for e in ids]), strict=True):
            theirs = set(entry.ids)
            mine = set(ours)
            self._only_remote += [item for item in entry.ids if item not in mine]
            self._only_local += [item for item in ours if item not in theirs]
        digests = await self.local.fingerprints([(e.lower, e.upper) for e in prints])
        await self._differs(
            [
                ((entry.lower, entry.upper), entry.count, ours.count)
                for entry, ours in zip(prints, digests, strict=True)
                if not _matches(entry, ours)
            ]
        )
        end = message.end
        for ask in self._pending:  # what the reply did not reach is asked again
            if end is not None and (ask.upper is None or ask.upper > end):
                lower = max(ask.lower, end)
                self._queue.append(_Ask(lower, ask.upper, ask.mode, ask.digest if lower == ask.lower else None))
        self._pending = []

    async def _differs(self, ranges: Sequence[tuple[Range, int, int]]) -> None:
        """Decide for each mismatched ``(range, server count, local count)``:
        settle it (the server has none), ask for its ids, or split it."""
        empty = [span for span, theirs, _ in ranges if theirs == 0]
        for ids in await self.local.items(empty):
            self._only_local += ids
        split: list[Range] = []
        for span, theirs, ours in ranges:
            if theirs == 0:
                continue
            if ours == 0 or theirs <= LEAF or abs(theirs - ours) >= self.full_list_fraction * max(theirs, ours):
                self._queue.append(_Ask(*span, Mode.LIST))
            else:
                split.append(span)
        for parts in await self.local.parts(split, BRANCHING):
            self._queue += [_Ask(part.lower, part.upper, Mode.FINGERPRINT, part.digest) for part in parts]

    async def _next(self) -> bytes | None:
        if not self._queue:
            await self._finish()
            return None
        self._queue.sort(key=lambda ask: ask.lower)
        batch = self._queue[: self.limits.max_request_ranges // 2]
        unknown = [ask for ask in batch if ask.mode == Mode.FINGERPRINT and ask.digest is None]
        for ask, digest in zip(
            unknown, await self.local.fingerprints([(a.lower, a.upper) for a in unknown]), strict=True
        ):
            ask.digest = digest
        encoder, sent = Encoder(), 0
        for ask in batch:
            mark = encoder.mark()
            if ask.mode == Mode.LIST:
                encoder.list_request(ask.lower, ask.upper)
            else:
                assert ask.digest is not None  # every FINGERPRINT ask of the batch has one (above)
                encoder.fingerprint(ask.lower, ask.upper, ask.digest.count, ask.digest.hash)
            if len(encoder) > self.limits.max_request_bytes:
                encoder.rollback(mark)
                break
            sent += 1
        self._pending, self._queue = self._queue[:sent], self._queue[sent:]
        request = encoder.finish()
        self.bytes_sent += len(request)
        self.state = State.WAITING
        return request

    async def _finish(self) -> None:
        """Check that local, minus only_local, plus only_remote, is remote."""
        self._only_local.sort()
        self._only_remote.sort()
        ours = await self.local.digest()
        count = ours.count - len(self._only_local) + len(self._only_remote)
        value = ours.hash ^ xor_hashes(self._only_local) ^ xor_hashes(self._only_remote)
        if Digest(count, value) != self.remote:
            raise ReconciliationError("the differences found do not explain the server's digest")
        self.state = State.DONE


def _check_inside(entries: list[Entry], asks: list[_Ask]) -> None:
    """Every entry of a reply must lie inside one range the client asked
    about (both lists are sorted): a peer cannot make us settle other ranges."""
    index = 0
    for entry in entries:
        while index < len(asks) and (passed := asks[index].upper) is not None and passed <= entry.lower:
            index += 1
        ask = asks[index] if index < len(asks) else None
        if (
            ask is None
            or ask.lower > entry.lower
            or (ask.upper is not None and (entry.upper is None or entry.upper > ask.upper))
        ):
            raise MalformedMessage("reply entry outside the ranges asked about")
