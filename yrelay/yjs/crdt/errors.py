"""What every engine of :mod:`yrelay.yjs.crdt` shares: the error, the empty
update, and the checks yrelay does itself (no engine, pure Python)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from yrelay.yjs import update_format

#: The update a transaction that changed nothing encodes to.
EMPTY_UPDATE = b"\x00\x00"


class InvalidUpdate(ValueError):
    """The bytes are not a decodable Yjs (v1) update."""


@contextmanager
def refused(what: str) -> Iterator[None]:
    """What the engine raises inside, as InvalidUpdate ("not a Yjs ``what``").
    Rust panics surface as pyo3's PanicException, a BaseException: refused
    too, or each would cost a validator process and its restart. Real
    control-flow exceptions pass through."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - a panic of the engine
        raise InvalidUpdate(f"not a Yjs {what}: {str(exc)[:200]}") from None


def check_layout(update: bytes) -> None:
    """The strict layout check alone (yrelay's own decoder, no engine): GC
    must be able to read whatever is stored. Pure Python, linear in size."""
    if not update:
        raise InvalidUpdate("empty update")
    try:
        update_format.decode(update)
    except update_format.MalformedUpdate as exc:
        raise InvalidUpdate(f"not a Yjs update: {exc}") from None


def check_state_vector(state_vector: bytes) -> None:
    """Raise :class:`InvalidUpdate` unless ``state_vector`` is a well-formed
    state vector whose numbers are below 2**53 (pure Python: y-py aborts the
    process on some that are not, see :func:`update_format.decode_state_vector`)."""
    try:
        update_format.decode_state_vector(state_vector)
    except update_format.MalformedUpdate as exc:
        raise InvalidUpdate(f"not a Yjs state vector: {exc}") from None
