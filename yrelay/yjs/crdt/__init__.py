"""Yjs documents for the Python client, tests and tools, on either engine,
and the checks an update passes before it is stored.

Two engines speak the same Yjs v1 updates:

- **pycrdt** (the default; :mod:`.pycrdt_doc`): maintained, abi3 wheels for
  CPython 3.11 and later, applies updates in any order;
- **y-py** (``engine="y-py"``, the ``ypy`` extra; :mod:`.ypy_doc`): archived,
  kept for code written against ``y_py.YDoc``. Imported only when a y-py
  document or check is asked for.

Every helper takes a document of either engine and dispatches on its type,
so ``crdt.insert_text(doc, 0, "hi")`` reads the same for both. The server's
sync answers and GC folds are in :mod:`yrelay.yjs.engine` (pycrdt, in worker
processes).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pycrdt

from yrelay.yjs import update_format
from yrelay.yjs.crdt import pycrdt_doc
from yrelay.yjs.crdt.errors import EMPTY_UPDATE, InvalidUpdate, check_layout, check_state_vector

if TYPE_CHECKING:
    import y_py

    Doc = pycrdt.Doc[Any] | y_py.YDoc
else:
    Doc = Any

_D = TypeVar("_D")


class _Engine(Protocol[_D]):
    """What an engine module (:mod:`.pycrdt_doc`, :mod:`.ypy_doc`) provides
    for documents of its own type ``_D``: the helpers below dispatch to one
    after picking it from the document's type, so each module is checked
    against this once, where it is chosen."""

    def validate_update(self, update: bytes) -> None: ...
    def new_doc(self, client_id: int | None = None) -> _D: ...
    def apply_update(self, doc: _D, update: bytes) -> None: ...
    def encode_state(self, doc: _D, state_vector: bytes | None = None) -> bytes: ...
    def state_vector(self, doc: _D) -> bytes: ...
    def observe_updates(self, doc: _D, callback: Callable[[bytes], object]) -> object: ...
    def text_of(self, doc: _D, name: str) -> str: ...
    def edit_text(self, doc: _D, name: str, index: int, length: int, chunk: str) -> None: ...


__all__ = [
    "EMPTY_UPDATE",
    "ENGINES",
    "Doc",
    "EngineMissing",
    "InvalidUpdate",
    "Replica",
    "apply_update",
    "apply_updates",
    "check_layout",
    "check_state_vector",
    "contains",
    "delete_text",
    "encode_state",
    "engine_of",
    "held_prefix",
    "insert_text",
    "merge_updates",
    "new_doc",
    "observe_updates",
    "replace_text",
    "state_vector",
    "text_of",
    "validate_update",
]

#: Engine names, as ``new_doc(engine=...)`` and ``YrelayClient(engine=...)`` take them.
PYCRDT, YPY = "pycrdt", "y-py"
ENGINES = (PYCRDT, YPY)
#: The extra that installs y-py (``pip install 'yrelay[ypy]'``).
YPY_EXTRA = "ypy"


class EngineMissing(ImportError):
    """y-py was asked for, and it is not installed."""


def ypy_available() -> bool:
    """True when y-py can be imported here (without importing it)."""
    return importlib.util.find_spec("y_py") is not None


def _ypy() -> _Engine[y_py.YDoc]:
    try:
        from yrelay.yjs.crdt import ypy_doc
    except ImportError as exc:
        raise EngineMissing(
            f"the y-py engine needs the {YPY_EXTRA} extra: pip install 'yrelay[{YPY_EXTRA}]' "
            f"(y-py 0.6.2 has wheels for CPython 3.10-3.12 only) ({exc})"
        ) from None
    return ypy_doc


def _module(doc: Doc) -> _Engine[Any]:
    """The engine module of ``doc``: a document not of pycrdt is y-py's (if
    it exists, y-py is importable). _Engine[Any]: the engine is the one of
    ``doc``'s own type, which the two engines' union cannot say."""
    return pycrdt_doc if isinstance(doc, pycrdt.Doc) else _ypy()


def engine_of(doc: Doc) -> str:
    """``"pycrdt"`` or ``"y-py"``."""
    return PYCRDT if isinstance(doc, pycrdt.Doc) else YPY


def _engine_module(engine: str) -> _Engine[Any]:
    if engine == PYCRDT:
        return pycrdt_doc
    if engine == YPY:
        return _ypy()
    raise ValueError(f"unknown CRDT engine {engine!r}: expected one of {', '.join(ENGINES)}")


def check_engine(engine: str) -> None:
    """Raise ValueError for an unknown name, :class:`EngineMissing` when it is
    not installed (what a constructor taking ``engine=`` checks first)."""
    _engine_module(engine)


# ------------------------------------------------------------ validation


def validate_update(update: bytes, with_ypy: bool = False) -> None:
    """Raise :class:`InvalidUpdate` unless ``update`` passes yrelay's layout
    check and pycrdt decodes it; ``with_ypy`` adds y-py's check (deployments
    with y-py clients: nothing a y-py client aborts on is stored). An update
    whose dependencies are missing still decodes (it stays pending), which
    is what a relay must accept. The engines run in validator processes
    (:mod:`yrelay.yjs.validation`): both have aborted or panicked on hostile input."""
    check_layout(update)
    pycrdt_doc.validate_update(update)
    if with_ypy:
        check_ypy_client_ids(update)
        _ypy().validate_update(update)


#: y-py 0.6.2 keeps client ids in 32 bits: it reads a larger one as its low
#: 32 bits, i.e. as another client (Yjs and pycrdt take up to 53 bits).
YPY_MAX_CLIENT_ID = 2**32 - 1


def check_ypy_client_ids(update: bytes) -> None:
    """Raise :class:`InvalidUpdate` when ``update`` writes or deletes content
    of a client id past 32 bits: y-py peers would take it for another client
    and never converge with the rest (a pycrdt document made with
    ``pycrdt.Doc()`` has such ids; :func:`new_doc`'s do not)."""
    coverage = update_format.decode(update)
    if any(client > YPY_MAX_CLIENT_ID for client in (*coverage.structs, *coverage.deletes)):
        raise InvalidUpdate(
            "not a Yjs update for y-py clients: a client id past 2**32 - 1 (y-py reads it as another client)"
        )


# ------------------------------------------------------------ documents


def new_doc(client_id: int | None = None, engine: str = PYCRDT) -> Doc:
    """A fresh document of ``engine`` (``client_id`` fixes the Yjs client id, for tests)."""
    doc: Doc = _engine_module(engine).new_doc(client_id)  # of the engine named
    return doc


def apply_update(doc: Doc, update: bytes) -> None:
    """Integrate ``update`` into ``doc`` (idempotent); raises :class:`InvalidUpdate`."""
    _module(doc).apply_update(doc, update)


def apply_updates(doc: Doc, updates: Sequence[bytes]) -> None:
    """Integrate ``updates`` in any order.

    pycrdt retries pending structs itself: one pass. y-py 0.6.2 keeps an
    update whose dependencies are missing as "pending" and never retries it
    when they arrive later, so for a y-py document the updates are applied
    in each client's clock order (:func:`update_format.causal_order`, one
    pass); should a dependency on another client's item still leave one
    pending, the batch is re-applied until the document stops changing
    (re-applying an integrated update is a no-op).
    """
    engine = _module(doc)
    if engine is not pycrdt_doc:
        updates = update_format.causal_order(updates)
    for update in updates:
        engine.apply_update(doc, update)
    if engine is pycrdt_doc:
        return
    state = engine.encode_state(doc)
    for _ in range(len(updates)):
        for update in updates:
            engine.apply_update(doc, update)
        settled = engine.encode_state(doc)
        if settled == state:
            return
        state = settled


def merge_updates(updates: Iterable[bytes], base: bytes | None = None, engine: str = PYCRDT) -> bytes:
    """Fold ``updates`` (on top of ``base``) into one update, in any order
    (what ``engine`` holds of them: pending structs are left out)."""
    doc = new_doc(engine=engine)
    apply_updates(doc, ([base] if base else []) + list(updates))
    return encode_state(doc)


def encode_state(doc: Doc, state_vector: bytes | None = None) -> bytes:
    """The update that brings a peer at ``state_vector`` (or nothing) to
    ``doc``. Neither engine encodes its pending structs (Yjs does)."""
    return _module(doc).encode_state(doc, state_vector)


def state_vector(doc: Doc) -> bytes:
    """The compact summary of what ``doc`` holds (client id -> clock)."""
    return _module(doc).state_vector(doc)


def held_prefix(doc: Doc, updates: Sequence[bytes]) -> int:
    """How many of ``updates``, from the first on, ``doc`` fully holds.

    An update whose dependencies ``doc`` lacks stays pending, and every
    encoding of ``doc`` leaves it out: whoever hands ``doc`` on as "everything
    up to update N" must stop before the first one not held."""
    return update_format.held_prefix(update_format.decode(encode_state(doc)), updates)


def contains(doc: Doc, update: bytes) -> bool:
    """True when everything ``update`` inserts and deletes is integrated in ``doc``
    (a pending, unintegrated update is not contained)."""
    return held_prefix(doc, [update]) == 1


def observe_updates(doc: Doc, callback: Callable[[bytes], object]) -> object:
    """Call ``callback(update_bytes)`` after every transaction that changed ``doc``
    (local edits and applied updates alike)."""
    return _module(doc).observe_updates(doc, callback)


# ------------------------------------------------------------ text


def text_of(doc: Doc, name: str = "text") -> str:
    """The string content of the root text type ``name``."""
    return _module(doc).text_of(doc, name)


def insert_text(doc: Doc, index: int, chunk: str, name: str = "text") -> None:
    """Insert ``chunk`` at ``index`` into the root text ``name`` (one transaction)."""
    _module(doc).edit_text(doc, name, index, 0, chunk)


def delete_text(doc: Doc, index: int, length: int, name: str = "text") -> None:
    """Delete ``length`` characters at ``index`` from the root text ``name``."""
    _module(doc).edit_text(doc, name, index, length, "")


def replace_text(doc: Doc, index: int, length: int, chunk: str, name: str = "text") -> None:
    """Delete ``length`` characters at ``index`` and insert ``chunk`` there, in
    one transaction (one update carrying both)."""
    _module(doc).edit_text(doc, name, index, length, chunk)


# ------------------------------------------------------------ long-lived replicas


class Replica:
    """Incremental application for a long-lived document (the client's),
    that knows which applied updates may still be pending.

    Neither engine encodes pending structs, so whoever persists the document
    must keep those updates beside it (:attr:`suspects`). An update that did
    not move the state vector may be pending (or a duplicate): it is kept
    (bounded). With y-py it is also re-applied whenever a later update moves
    the state vector (y-py never retries pending updates itself; pycrdt does,
    so there the suspects it has since integrated are dropped instead).
    """

    MAX_SUSPECTS = 256

    def __init__(self, doc: Doc):
        self.doc = doc
        self._engine = _module(doc)
        self._suspects: list[bytes] = []

    def apply(self, update: bytes) -> None:
        before = self._engine.state_vector(self.doc)
        self._engine.apply_update(self.doc, update)
        if self._engine.state_vector(self.doc) == before:
            self._suspects.append(update)
            if len(self._suspects) > self.MAX_SUSPECTS:
                self._prune()
                del self._suspects[: -self.MAX_SUSPECTS]
        elif self._suspects and self._engine is not pycrdt_doc:
            self._retry_suspects()

    @property
    def suspects(self) -> list[bytes]:
        """Updates that may still be pending: ``encode_state`` leaves them out,
        so whoever persists the document must keep them beside it."""
        self._prune()
        return list(self._suspects)

    def _prune(self) -> None:
        """Drop the suspects the document now holds in full (duplicates, and
        pending ones integrated since)."""
        if self._suspects:
            held = update_format.decode(self._engine.encode_state(self.doc))
            self._suspects = [update for update in self._suspects if update_format.held_prefix(held, [update]) == 0]

    def _retry_suspects(self) -> None:
        while True:
            before = self._engine.state_vector(self.doc)
            for update in self._suspects:
                self._engine.apply_update(self.doc, update)
            if self._engine.state_vector(self.doc) == before:
                return
