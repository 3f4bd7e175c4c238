"""The pycrdt engine of :mod:`yrelay.yjs.crdt`: the default documents of the
Python client, and the check every stored update passes.

pycrdt (maintained, newer Yrs, abi3 wheels for CPython 3.11 and later)
retries pending structs itself, so updates apply in any order, and raises
ValueError on the hostile inputs y-py aborts on (docs/architecture.md#crdt-engine).
A document belongs to the thread that made it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pycrdt

from yrelay.yjs.crdt.errors import EMPTY_UPDATE, InvalidUpdate, check_state_vector, refused

Doc = pycrdt.Doc[Any]


def validate_update(update: bytes) -> None:
    """Raise :class:`InvalidUpdate` unless pycrdt decodes ``update``. pycrdt
    panics on some hostile updates (pyo3's PanicException, a BaseException):
    refused too, or each would cost a validator process and its restart."""
    with refused("update"):
        pycrdt.Doc().apply_update(update)


def new_doc(client_id: int | None = None) -> Doc:
    """A random client id fits 32 bits, as Yjs (``random.uint32()``) and y-py
    make them: pycrdt's own are up to 53 bits, and y-py 0.6.2 reads such an id
    as another client (its low 32 bits), so y-py peers of the document would
    order and count its content differently for ever."""
    return pycrdt.Doc(client_id=client_id if client_id is not None else random.getrandbits(32))


def apply_update(doc: Doc, update: bytes) -> None:
    with refused("update"):
        doc.apply_update(update)


def encode_state(doc: Doc, state_vector: bytes | None = None) -> bytes:
    """Pending structs are left out (as y-py does; Yjs keeps them)."""
    if state_vector is None:
        return doc.get_update()
    check_state_vector(state_vector)
    try:
        return doc.get_update(state_vector)
    except ValueError as exc:
        raise InvalidUpdate(f"not a Yjs state vector: {str(exc)[:200]}") from None


def state_vector(doc: Doc) -> bytes:
    return doc.get_state()


def observe_updates(doc: Doc, callback: Callable[[bytes], object]) -> object:
    """pycrdt calls observers once per transaction that changed something."""

    def on_transaction(event: pycrdt.TransactionEvent) -> None:
        update = event.update
        if update != EMPTY_UPDATE:
            callback(update)

    return doc.observe(on_transaction)


def text_of(doc: Doc, name: str) -> str:
    return str(doc.get(name, type=pycrdt.Text))


def edit_text(doc: Doc, name: str, index: int, length: int, chunk: str) -> None:
    """Delete ``length`` characters at ``index``, then insert ``chunk`` there (one transaction)."""
    text = doc.get(name, type=pycrdt.Text)
    with doc.transaction():
        if length:
            del text[index : index + length]
        if chunk:
            text.insert(index, chunk)
