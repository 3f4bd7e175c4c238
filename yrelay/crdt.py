"""Everything yrelay needs from the CRDT library, behind one small interface.

The rest of the code base never imports ``y_py``; swapping it for pycrdt (or a
later Yrs binding) means changing this module only.
"""

from __future__ import annotations

from collections.abc import Iterable

import y_py

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
    if not update:
        raise InvalidUpdate("empty update")
    try:
        y_py.apply_update(y_py.YDoc(), update)
    except BaseException as exc:  # noqa: BLE001 - see _reraise_control_flow
        _reraise_control_flow(exc)
        raise InvalidUpdate(f"not a Yjs update: {str(exc)[:200]}") from None


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


def merge_updates(updates: Iterable[bytes], base: bytes | None = None) -> bytes:
    """Fold ``updates`` (on top of ``base``) into one update."""
    doc = new_doc()
    if base:
        apply_update(doc, base)
    for update in updates:
        apply_update(doc, update)
    return encode_state(doc)


def encode_state(doc: Doc, state_vector: bytes | None = None) -> bytes:
    """The update that brings a peer at ``state_vector`` (or nothing) to ``doc``."""
    if state_vector is None:
        return y_py.encode_state_as_update(doc)
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
