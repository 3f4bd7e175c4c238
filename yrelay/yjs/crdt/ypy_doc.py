"""The y-py engine of :mod:`yrelay.yjs.crdt` (the ``ypy`` extra): documents of
code written against y-py, and y-py's check for deployments with y-py clients.

y-py 0.6.2 is archived (no wheels past CPython 3.12). Only this module
imports ``y_py``, and only when a y-py document or check is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import cast

import y_py

from yrelay.yjs.crdt.errors import EMPTY_UPDATE, check_state_vector, refused

Doc = y_py.YDoc


def validate_update(update: bytes) -> None:
    """Raise :class:`InvalidUpdate` unless y-py decodes ``update`` (into a
    scratch document). Run it in a worker process: y-py aborts the process
    on some hostile updates (docs/security.md#validation)."""
    with refused("update"):
        y_py.apply_update(y_py.YDoc(), update)


def new_doc(client_id: int | None = None) -> Doc:
    return y_py.YDoc(client_id) if client_id is not None else y_py.YDoc()


def apply_update(doc: Doc, update: bytes) -> None:
    with refused("update"):
        y_py.apply_update(doc, update)


def encode_state(doc: Doc, state_vector: bytes | None = None) -> bytes:
    if state_vector is None:
        return y_py.encode_state_as_update(doc)
    check_state_vector(state_vector)
    with refused("state vector"):
        return y_py.encode_state_as_update(doc, state_vector)


def state_vector(doc: Doc) -> bytes:
    return y_py.encode_state_vector(doc)


def observe_updates(doc: Doc, callback: Callable[[bytes], object]) -> object:
    def on_transaction(event: y_py.AfterTransactionEvent) -> None:
        update = event.get_update()
        if update != EMPTY_UPDATE:
            callback(update)

    return doc.observe_after_transaction(on_transaction)


def text_of(doc: Doc, name: str) -> str:
    return str(doc.get_text(name))


def _transaction(doc: Doc) -> AbstractContextManager[y_py.YTransaction]:
    """``doc.begin_transaction()``, a context manager that commits on exit:
    y-py 0.6.2's stub declares its ``__enter__``/``__exit__`` without ``self``,
    so the type says here what the object is."""
    return cast(AbstractContextManager[y_py.YTransaction], doc.begin_transaction())


def edit_text(doc: Doc, name: str, index: int, length: int, chunk: str) -> None:
    """Delete ``length`` characters at ``index``, then insert ``chunk`` there (one transaction)."""
    text = doc.get_text(name)
    with _transaction(doc) as txn:
        if length:
            text.delete_range(txn, index, length)
        if chunk:
            text.insert(txn, index, chunk)
