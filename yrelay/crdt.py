"""The y-py side of yrelay: the Python client's documents, and update
validation, behind one small interface.

The rest of the code base never imports ``y_py``. The server computes sync
answers and GC folds with pycrdt instead (:mod:`yrelay.engine`, chosen in
docs/architecture.md#crdt-engine); both speak plain Yjs v1 updates.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import y_py

from . import update_format

#: The update a transaction that changed nothing encodes to.
EMPTY_UPDATE = b"\x00\x00"

Doc = y_py.YDoc


class InvalidUpdate(ValueError):
    """The bytes are not a decodable Yjs (v1) update."""


def _reraise_control_flow(exc: BaseException) -> None:
    # Rust panics surface as pyo3's PanicException, a BaseException; those we
    # turn into InvalidUpdate. Real control-flow exceptions must pass through.
    if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        raise exc


def validate_update(update: bytes) -> None:
    """Raise :class:`InvalidUpdate` unless ``update`` decodes as a Yjs update.

    Decoding into a scratch document is the only check y-py offers; an update
    whose dependencies are missing still decodes (it stays pending), which is
    what a relay must accept.
    """
    check_layout(update)
    try:
        y_py.apply_update(y_py.YDoc(), update)
    except BaseException as exc:  # noqa: BLE001 - see _reraise_control_flow
        _reraise_control_flow(exc)
        raise InvalidUpdate(f"not a Yjs update: {str(exc)[:200]}") from None


def check_layout(update: bytes) -> None:
    """The strict layout check alone (yrelay's own decoder, no y-py): GC
    must be able to read whatever is stored. Pure Python, linear in size."""
    if not update:
        raise InvalidUpdate("empty update")
    try:
        update_format.decode(update)
    except update_format.MalformedUpdate as exc:
        raise InvalidUpdate(f"not a Yjs update: {exc}") from None


def new_doc(client_id: int | None = None) -> Doc:
    """A fresh document (``client_id`` fixes the Yjs client id, for tests)."""
    return y_py.YDoc(client_id) if client_id is not None else y_py.YDoc()


def apply_update(doc: Doc, update: bytes) -> None:
    """Integrate ``update`` into ``doc`` (idempotent, order-independent)."""
    try:
        y_py.apply_update(doc, update)
    except BaseException as exc:  # noqa: BLE001
        _reraise_control_flow(exc)
        raise InvalidUpdate(f"not a Yjs update: {str(exc)[:200]}") from None


def apply_updates(doc: Doc, updates: Sequence[bytes]) -> None:
    """Integrate ``updates`` in any order.

    y-py 0.6.2 keeps an update whose dependencies are missing as "pending" and
    never retries it when they arrive later (Yjs and newer Yrs do). Out-of-order
    updates are normal here (a retried update lands after a later one), so the
    updates are applied in each client's clock order
    (:func:`update_format.causal_order`, one pass); should a dependency on
    another client's item still leave one pending, the batch is re-applied
    until the document stops changing (re-applying an integrated update is a
    no-op). The server's engine (:mod:`yrelay.engine`) needs none of this.
    """
    updates = update_format.causal_order(updates)
    for update in updates:
        apply_update(doc, update)
    state = encode_state(doc)
    for _ in range(len(updates)):
        for update in updates:
            apply_update(doc, update)
        settled = encode_state(doc)
        if settled == state:
            return
        state = settled


def merge_updates(updates: Iterable[bytes], base: bytes | None = None) -> bytes:
    """Fold ``updates`` (on top of ``base``) into one update, in any order."""
    doc = new_doc()
    apply_updates(doc, ([base] if base else []) + list(updates))
    return encode_state(doc)


def held_prefix(doc: Doc, updates: Sequence[bytes]) -> int:
    """How many of ``updates``, from the first on, ``doc`` fully holds.

    An update whose dependencies ``doc`` lacks stays pending in y-py, and every
    encoding of ``doc`` leaves it out: whoever hands ``doc`` on as "everything
    up to update N" must stop before the first one not held."""
    return update_format.held_prefix(update_format.decode(encode_state(doc)), updates)


def contains(doc: Doc, update: bytes) -> bool:
    """True when everything ``update`` inserts and deletes is integrated in ``doc``
    (a pending, unintegrated update is not contained)."""
    return update_format.held_prefix(update_format.decode(encode_state(doc)), [update]) == 1


class Replica:
    """Incremental application for a long-lived y-py document (clients).

    Works around the same y-py defect as :func:`apply_updates`: an update that
    did not move the state vector may be stuck as pending; such updates are
    kept (bounded) and re-applied whenever a later update moves it.
    """

    MAX_SUSPECTS = 256

    def __init__(self, doc: Doc):
        self.doc = doc
        self._suspects: list[bytes] = []

    def apply(self, update: bytes) -> None:
        before = state_vector(self.doc)
        apply_update(self.doc, update)
        if state_vector(self.doc) == before:
            self._suspects.append(update)
            del self._suspects[: -self.MAX_SUSPECTS]
        elif self._suspects:
            self._retry_suspects()

    @property
    def suspects(self) -> list[bytes]:
        """Updates that may still be pending: ``encode_state`` leaves them out,
        so whoever persists the document must keep them beside it."""
        return list(self._suspects)

    def _retry_suspects(self) -> None:
        while True:
            before = state_vector(self.doc)
            for update in self._suspects:
                apply_update(self.doc, update)
            if state_vector(self.doc) == before:
                return


def check_state_vector(state_vector: bytes) -> None:
    """Raise :class:`InvalidUpdate` unless ``state_vector`` is a well-formed
    state vector whose numbers are below 2**53 (pure Python: y-py aborts the
    process on some that are not, see :func:`update_format.decode_state_vector`)."""
    try:
        update_format.decode_state_vector(state_vector)
    except update_format.MalformedUpdate as exc:
        raise InvalidUpdate(f"not a Yjs state vector: {exc}") from None


def encode_state(doc: Doc, state_vector: bytes | None = None) -> bytes:
    """The update that brings a peer at ``state_vector`` (or nothing) to ``doc``."""
    if state_vector is None:
        return y_py.encode_state_as_update(doc)
    check_state_vector(state_vector)
    try:
        return y_py.encode_state_as_update(doc, state_vector)
    except BaseException as exc:  # noqa: BLE001
        _reraise_control_flow(exc)
        raise InvalidUpdate(f"not a Yjs state vector: {str(exc)[:200]}") from None


def state_vector(doc: Doc) -> bytes:
    """The compact summary of what ``doc`` holds (client id -> clock)."""
    return y_py.encode_state_vector(doc)


def observe_updates(doc: Doc, callback) -> object:
    """Call ``callback(update_bytes)`` after every transaction that changed ``doc``."""

    def on_transaction(event: y_py.AfterTransactionEvent) -> None:
        update = event.get_update()
        if update != EMPTY_UPDATE:
            callback(update)

    return doc.observe_after_transaction(on_transaction)


def text_of(doc: Doc, name: str = "text") -> str:
    """The string content of the root text type ``name``."""
    return str(doc.get_text(name))


def insert_text(doc: Doc, index: int, chunk: str, name: str = "text") -> None:
    """Insert ``chunk`` at ``index`` into the root text ``name`` (one transaction)."""
    text = doc.get_text(name)
    with doc.begin_transaction() as txn:
        text.insert(txn, index, chunk)


def delete_text(doc: Doc, index: int, length: int, name: str = "text") -> None:
    """Delete ``length`` characters at ``index`` from the root text ``name``."""
    text = doc.get_text(name)
    with doc.begin_transaction() as txn:
        text.delete_range(txn, index, length)


def replace_text(doc: Doc, index: int, length: int, chunk: str, name: str = "text") -> None:
    """Delete ``length`` characters at ``index`` and insert ``chunk`` there, in
    one transaction (one update carrying both)."""
    text = doc.get_text(name)
    with doc.begin_transaction() as txn:
        text.delete_range(txn, index, length)
        text.insert(txn, index, chunk)
