"""The server's CRDT engine: sync answers and GC folds, computed with pycrdt.

pycrdt (the maintained successor of y-py, newer Yrs) integrates updates in
any order in one pass and raises ``ValueError`` on every hostile input
measured, where y-py 0.6.2 aborts the process and needs a re-apply loop whose
cost grows ~n^2.8 with updates stored out of order (the figures and the
decision: docs/architecture.md#crdt-engine). Both speak Yjs v1 updates, so a
snapshot folded here is loaded by Python clients of either engine
(:mod:`yrelay.yjs.crdt`) and browsers alike.

The server never calls this module in its own process: the work runs in
``python -m yrelay.yjs.engine`` workers (:mod:`yrelay.yjs.engine_pool`), which
a crash or a deadline can cost, never the server. Request and reply are
frames: ``u8 tag``, ``u32 count``, then per item ``u32 length`` + bytes, all
big-endian. Requests: tag ``F`` (fold: base, updates...) or ``S`` (sync:
state vector, base, updates...). Replies: tag 0 with the result's items, or
tag 1 with the reason the input was refused. ``python -m yrelay.yjs.engine
--ypy`` also proves each fold against a y-py reload (deployments with y-py
clients: ``validate_with_ypy``, which needs the ``ypy`` extra).
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import pycrdt

from yrelay.yjs import crdt, update_format
from yrelay.yjs.crdt import pycrdt_doc

#: The byte a worker process (this one, or the validator's) writes once its
#: imports are done: the server's deadlines start from there.
READY = b"R"

#: The argument that makes a worker (this one, or the validator's) run y-py's checks too.
WITH_YPY_FLAG = "--ypy"

FOLD, SYNC = ord("F"), ord("S")
OK, REFUSED = 0, 1
_HEAD = struct.Struct(">BI")
_U32 = struct.Struct(">I")


@dataclass(frozen=True)
class Fold:
    """A new snapshot, and how many of the folded updates it surely holds."""

    snapshot: bytes
    #: The first ``held`` updates are all in ``snapshot``; ``held < len(updates)``
    #: means update number ``held`` did not land (its dependencies are missing,
    #: or it does not decode) and must stay in the stream.
    held: int


@dataclass(frozen=True)
class SyncAnswer:
    """What a peer at some state vector lacks, and what the server holds."""

    diff: bytes
    state_vector: bytes
    #: The first ``held`` stream updates are all in the document (the rest
    #: wait for dependencies): the answer covers the stream up to there.
    held: int


def _load(updates: Sequence[bytes]) -> pycrdt.Doc[Any]:
    """A document holding ``updates``, applied in the given order (pycrdt
    retries pending structs itself). An update pycrdt refuses is skipped: it
    is then not held, and whoever asks stops before it."""
    doc: pycrdt.Doc[Any] = pycrdt.Doc()
    for update in updates:
        if update:
            try:
                doc.apply_update(update)
            except ValueError:
                continue
    return doc


def validate_update(update: bytes) -> None:
    """Raise :class:`crdt.InvalidUpdate` unless pycrdt decodes ``update``:
    an update pycrdt cannot read would stay out of every sync answer and stop
    GC before it for good (it is never held). The validator workers run it
    (:func:`yrelay.yjs.crdt.validate_update`)."""
    pycrdt_doc.validate_update(update)


def _coverage_by_ypy(snapshot: bytes) -> update_format.Coverage:
    """What a y-py document holds once ``snapshot`` is loaded into it (in a
    worker process, y-py may abort it; tools fold in a thread).

    A y-py document belongs to the thread that made it: dropped on another,
    it is leaked and y-py prints "YDoc is unsendable, but is dropped on
    another thread". An exception's traceback keeps the frames it passed
    through, so raising out of here would carry the document to whichever
    thread handles the exception. The error is turned into a new one after
    the document is gone, here.
    """
    doc = crdt.new_doc(engine=crdt.YPY)
    try:
        crdt.apply_update(doc, snapshot)
        return _coverage(crdt.encode_state(doc))
    except crdt.InvalidUpdate as exc:
        reason = str(exc)  # leaving this block frees exc, its traceback and so the document's frames
    finally:
        del doc
    raise crdt.InvalidUpdate(reason)


def _coverage(encoded: bytes) -> update_format.Coverage:
    return update_format.decode(encoded)


def fold(base: bytes, updates: Sequence[bytes], with_ypy: bool = False) -> Fold:
    """Fold ``updates`` into the snapshot ``base`` and prove what the result holds.

    The proof reloads the new snapshot into a fresh document, exactly as
    later readers will (the server here, Python clients), and checks the
    ranges each update inserts and deletes against the reload
    (:mod:`yrelay.yjs.update_format`); ``with_ypy`` reloads it into a y-py
    document too (y-py cannot always reload what it did not write: a
    deployment with y-py clients must not lose content to GC). Neither engine keeps pending
    structs or deletes in its encoding, so trusting the encoding alone would
    let GC delete content. If even ``base`` is not fully held, ``held`` is 0
    and the snapshot must not be stored.
    """
    base_part, *parts = [update_format.decode_or_none(update) for update in (base, *updates)]
    doc = _load([base, *updates])
    snapshot = update_format.with_deletes(doc.get_update(), _pending_deletes(doc.get_state(), [base_part, *parts]))
    wholes = [_coverage(_load([snapshot]).get_update())]
    if with_ypy and (by_ypy := _coverage_by_ypy(snapshot)) != wholes[0]:
        wholes.append(by_ypy)
    if base and any(update_format.held_count(whole, [base_part]) == 0 for whole in wholes):
        return Fold(snapshot, 0)
    return Fold(snapshot, min(update_format.held_count(whole, parts) for whole in wholes))


def sync_answer(state_vector: bytes, base: bytes, updates: Sequence[bytes]) -> SyncAnswer:
    """The two-way exchange's answer over the snapshot ``base`` and the stream
    ``updates``; raises :class:`crdt.InvalidUpdate` for a bad state vector
    (checked by yrelay's own decoder before pycrdt sees it)."""
    crdt.check_state_vector(state_vector)
    doc = _load([base, *updates])
    try:
        diff = doc.get_update(state_vector)
    except ValueError as exc:
        raise crdt.InvalidUpdate(f"not a Yjs state vector: {str(exc)[:200]}") from None
    base_part, *parts = [update_format.decode_or_none(update) for update in (base, *updates)]
    held = update_format.held_count(_coverage(doc.get_update()), parts)
    state = doc.get_state()
    diff = update_format.with_deletes(diff, _pending_deletes(state, [base_part, *parts]))
    return SyncAnswer(diff, state, held)


def _pending_deletes(state_vector: bytes, parts: Sequence[update_format.Coverage | None]) -> update_format.Ranges:
    """Deletions among the updates (``parts``, decoded; None for one that is
    not an update) of content past the document's state (``state_vector``,
    its engine's encoding): kept in what the server hands on (snapshot, sync
    answer), as Yjs keeps them pending, so content deleted before it arrived
    stays deleted."""
    return update_format.pending_deletes(
        update_format.decode_state_vector(state_vector), [part for part in parts if part is not None]
    )


# -------------------------------------------------------- the worker's wire


def encode_frame(tag: int, items: Sequence[bytes]) -> bytes:
    return _HEAD.pack(tag, len(items)) + b"".join(_U32.pack(len(item)) + item for item in items)


def answer(tag: int, items: list[bytes], with_ypy: bool = False) -> bytes:
    """The reply frame to one request frame (runs in the worker)."""
    try:
        if tag == FOLD:
            result = fold(items[0], items[1:], with_ypy)
            return encode_frame(OK, [result.snapshot, str(result.held).encode()])
        if tag == SYNC:
            reply = sync_answer(items[0], items[1], items[2:])
            return encode_frame(OK, [reply.diff, reply.state_vector, str(reply.held).encode()])
        return encode_frame(REFUSED, [f"unknown request {tag}".encode()])
    except (crdt.InvalidUpdate, update_format.MalformedUpdate, IndexError) as exc:
        return encode_frame(REFUSED, [str(exc)[:200].encode()])


def read_exact(stream: BinaryIO, size: int) -> bytes | None:
    """``size`` bytes of a worker's stdin, or None once it is closed."""
    data = stream.read(size)
    return data if data is not None and len(data) == size else None


def announce_ready(stdout: BinaryIO) -> None:
    """Tell the server a worker's imports are done: its deadlines start here."""
    stdout.write(READY)
    stdout.flush()


def serve(stdin: BinaryIO, stdout: BinaryIO, with_ypy: bool = False) -> None:
    """Answer request frames until stdin closes."""
    if with_ypy:
        crdt.check_engine(crdt.YPY)  # imported before the server's deadlines start
    announce_ready(stdout)
    while (head := read_exact(stdin, _HEAD.size)) is not None:
        tag, count = _HEAD.unpack(head)
        items = []
        for _ in range(count):
            length = read_exact(stdin, _U32.size)
            item = read_exact(stdin, _U32.unpack(length)[0]) if length is not None else None
            if item is None:
                return
            items.append(item)
        stdout.write(answer(tag, items, with_ypy))
        stdout.flush()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer, with_ypy=WITH_YPY_FLAG in sys.argv[1:])
