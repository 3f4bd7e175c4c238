"""The y-protocols messages that y-websocket clients speak, encoded and
decoded on :mod:`yrelay.yjs.lib0` (pure: no socket, no CRDT library).

One websocket message is one message (``y-websocket/src/y-websocket.js``,
``y-protocols/sync.js``, ``awareness.js``, ``auth.js``)::

    varuint type          0 sync, 1 awareness, 2 auth, 3 query-awareness
    sync:       varuint step (0 step 1, 1 step 2, 2 update), varuint8array payload
                (step 1: a state vector; step 2 and update: a Yjs update)
    awareness:  varuint8array awareness update
    auth:       varuint 0 (permission denied), varstring reason
    query-awareness: nothing

Decoding is strict where lib0's is lenient: bytes after the message, an
unknown type or step, a length past the end all raise :class:`YProtocolError`
(a stock client never sends any of them). The payloads are not checked here:
a state vector, an update or an awareness update goes to its own checker.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from yrelay.yjs.lib0 import Reader, varuint, write_varstring, write_varuint, write_varuint8array


class YProtocolError(ValueError):
    """Bytes that are not one y-protocols message."""


class MessageType(enum.IntEnum):
    SYNC = 0
    AWARENESS = 1
    AUTH = 2
    QUERY_AWARENESS = 3


class SyncStep(enum.IntEnum):
    STEP1 = 0
    STEP2 = 1
    UPDATE = 2


#: The one auth message y-protocols defines.
AUTH_PERMISSION_DENIED = 0


@dataclass(frozen=True)
class SyncMessage:
    step: SyncStep
    #: A state vector (step 1) or a Yjs update (step 2, update).
    payload: bytes


@dataclass(frozen=True)
class AwarenessMessage:
    update: bytes


@dataclass(frozen=True)
class AuthMessage:
    """Permission denied, and why (the only auth message there is)."""

    reason: str


@dataclass(frozen=True)
class QueryAwarenessMessage:
    pass


Message = SyncMessage | AwarenessMessage | AuthMessage | QueryAwarenessMessage


def decode(data: bytes) -> Message:
    """One message, or :class:`YProtocolError` saying what is wrong."""
    reader = Reader(data, YProtocolError)
    kind = reader.varuint()
    message: Message
    if kind == MessageType.SYNC:
        step = reader.varuint()
        if step not in SyncStep._value2member_map_:
            raise YProtocolError(f"unknown sync step {step}")
        message = SyncMessage(SyncStep(step), reader.varuint8array("sync payload"))
    elif kind == MessageType.AWARENESS:
        message = AwarenessMessage(reader.varuint8array("awareness update"))
    elif kind == MessageType.AUTH:
        code = reader.varuint()
        if code != AUTH_PERMISSION_DENIED:
            raise YProtocolError(f"unknown auth message {code}")
        message = AuthMessage(reader.varstring("reason"))
    elif kind == MessageType.QUERY_AWARENESS:
        message = QueryAwarenessMessage()
    else:
        raise YProtocolError(f"unknown message type {kind}")
    if not reader.done():
        raise YProtocolError(f"{reader.remaining()} bytes after the message")
    return message


def _sync(step: SyncStep, payload: bytes) -> bytes:
    out = bytearray((MessageType.SYNC, step))
    write_varuint8array(out, payload)
    return bytes(out)


def sync_step1(state_vector: bytes) -> bytes:
    return _sync(SyncStep.STEP1, state_vector)


def sync_step2(update: bytes) -> bytes:
    return _sync(SyncStep.STEP2, update)


def sync_update(update: bytes) -> bytes:
    return _sync(SyncStep.UPDATE, update)


def awareness(update: bytes) -> bytes:
    out = bytearray(varuint(MessageType.AWARENESS))
    write_varuint8array(out, update)
    return bytes(out)


def query_awareness() -> bytes:
    return varuint(MessageType.QUERY_AWARENESS)


def permission_denied(reason: str) -> bytes:
    out = bytearray(varuint(MessageType.AUTH))
    write_varuint(out, AUTH_PERMISSION_DENIED)
    write_varstring(out, reason)
    return bytes(out)


def encode(message: Message) -> bytes:
    """The bytes of ``message`` (the inverse of :func:`decode`)."""
    if isinstance(message, SyncMessage):
        return _sync(message.step, message.payload)
    if isinstance(message, AwarenessMessage):
        return awareness(message.update)
    if isinstance(message, AuthMessage):
        return permission_denied(message.reason)
    return query_awareness()


__all__ = [
    "AUTH_PERMISSION_DENIED",
    "AuthMessage",
    "AwarenessMessage",
    "Message",
    "MessageType",
    "QueryAwarenessMessage",
    "SyncMessage",
    "SyncStep",
    "YProtocolError",
    "awareness",
    "decode",
    "encode",
    "permission_denied",
    "query_awareness",
    "sync_step1",
    "sync_step2",
    "sync_update",
]
