"""Wire frames of the yrelay websocket protocol (mirrored by docs/protocol.md).

Every frame is one JSON text message with an ``op`` field. Binary Yjs payloads
(updates, state vectors) travel base64-encoded. Frames that concern a document
name it in ``doc``, so one socket can carry many documents.
"""

from __future__ import annotations

import base64
import binascii
import enum
import itertools
import json
import re
from typing import Annotated, Any, Literal, TypeAlias, get_args

import msgspec
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from yrelay.storage.keys import DOC_ID_PATTERN, InvalidDocumentId, validate_doc_id
from yrelay.storage.offsets import InvalidOffset, StreamId

PROTOCOL_VERSION = 1

#: Additive protocol features this server speaks, announced in ``welcome``
#: (docs/protocol.md#features). A client uses a feature only when the server
#: announced it, so today's clients and servers keep working with older ones.
FEATURES = (
    "strict_types",  # wrong JSON types are malformed_frame, never coerced
    "causal_admission",  # an update is stored only when the document can apply it (missing_dependency)
    "sync_push",  # update {sync: true}: the server stores the causally ready part of a diff
    "update_parts",  # update {part, parts}: one update larger than a frame, sent in parts
    "synced",  # a `synced` frame once the subscriber holds everything admitted when it subscribed
)


class Op(str, enum.Enum):
    """Operation names. Client -> server first, then server -> client."""

    HELLO = "hello"
    SUBSCRIBE = "subscribe"
    UNSUBSCRIBE = "unsubscribe"
    UPDATE = "update"
    ACK = "ack"
    SYNC = "sync"
    CHECK_SUBSCRIPTIONS = "check_subscriptions"
    RECONCILE = "reconcile"
    PING = "ping"
    AWARENESS = "awareness"  # both directions: presence (docs/protocol.md#presence)
    # server -> client
    WELCOME = "welcome"
    SUBSCRIBED = "subscribed"
    UNSUBSCRIBED = "unsubscribed"
    SNAPSHOT = "snapshot"
    APPENDED = "appended"
    DELIVER = "deliver"
    RESYNC_REQUIRED = "resync_required"
    SYNC_REPLY = "sync_reply"
    SYNCED = "synced"
    SUBSCRIPTIONS = "subscriptions"
    RECONCILE_REPLY = "reconcile_reply"
    ERROR = "error"
    PONG = "pong"


class ErrorCode(str, enum.Enum):
    """Why the server rejected a frame. Every ``error`` frame carries one."""

    MALFORMED_FRAME = "malformed_frame"
    UNKNOWN_OP = "unknown_op"
    FRAME_TOO_LARGE = "frame_too_large"
    HANDSHAKE_REQUIRED = "handshake_required"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    INVALID_DOC_ID = "invalid_doc_id"
    INVALID_OFFSET = "invalid_offset"
    INVALID_UPDATE = "invalid_update"
    #: The document cannot apply the update yet: content it builds on is not
    #: stored. Carries ``missing``: {Yjs client id: the document's clock}.
    MISSING_DEPENDENCY = "missing_dependency"
    UPDATE_TOO_LARGE = "update_too_large"
    NOT_SUBSCRIBED = "not_subscribed"
    AWARENESS_TOO_LARGE = "awareness_too_large"
    AWARENESS_NOT_OWNER = "awareness_not_owner"
    AWARENESS_TOO_MANY_CLIENTS = "awareness_too_many_clients"
    DOCUMENT_UNAVAILABLE = "document_unavailable"
    #: An operator deleted the document (DELETE /ops/docs/{doc}): the
    #: subscription ended, or the update was not stored.
    DOCUMENT_DELETED = "document_deleted"
    UNAVAILABLE = "unavailable"
    #: The update IS stored, but fewer than ``ack_replicas`` replicas confirmed
    #: it in time: resend it (the resend is answered from the stored entry).
    REPLICATION_TIMEOUT = "replication_timeout"
    INTERNAL_ERROR = "internal_error"
    # limits (docs/operations.md#limits); each carries retry_after_ms
    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    TOO_MANY_SUBSCRIPTIONS = "too_many_subscriptions"


class ResyncReason(str, enum.Enum):
    """Why the server cannot resume a document from the client's offset."""

    TRIMMED = "trimmed"  # entries after the offset were compacted away
    AHEAD = "ahead"  # the offset is past the stream's last id (lost tail)
    EVICTED = "evicted"  # GC (or an operator) dropped the session from the tracker
    DRIFT = "drift"  # the drift digests differ over the same window, or could not be compared


class ProtocolError(Exception):
    """A frame the server must reject; turned into an ``error`` frame."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        doc: str | None = None,
        clock: int | None = None,
        retry_after_ms: int | None = None,
        missing: dict[int, int] | None = None,
    ):
        super().__init__(message)
        self.code = code
        self.message = message
        self.doc = doc
        self.clock = clock
        #: Limits: when the client may try again.
        self.retry_after_ms = retry_after_ms
        #: ``missing_dependency``: Yjs client id -> the clock the document holds up to.
        self.missing = missing

    @classmethod
    def about(cls, update: AnyUpdate, code: ErrorCode, message: str, **fields: Any) -> ProtocolError:
        """A refusal of one update frame, naming its doc and clock (how the
        client knows which of its updates it is about)."""
        return cls(code, message, doc=update.doc, clock=update.clock, **fields)


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not valid base64") from None


# ---------------------------------------------------------------- client frames


class _Frame(BaseModel):
    # strict: `"clock": true` or `"clock": "93"` is a malformed frame, never
    # coerced (a coerced clock once acked bytes that were dropped).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _DocFrame(_Frame):
    doc: str

    @field_validator("doc")
    @classmethod
    def _check_doc(cls, value: str) -> str:
        return validate_doc_id(value)


def _check_offset(value: str | None) -> str | None:
    if value is not None:
        StreamId.parse(value)
    return value


class Hello(_Frame):
    op: Literal["hello"]
    session: str | None = None
    protocol: int = PROTOCOL_VERSION
    #: The client's credential (a JWT by default); or sent as the websocket
    #: subprotocol ``yrelay.auth.<token>``. Never in the URL: URLs end up in logs.
    token: str | None = Field(default=None, max_length=16_384, repr=False)


class WindowDigest(_Frame):
    """Count and XOR of xxh3_128 over the stream ids held in ``(since, offset]``
    plus the client's own entries in ``(offset, through]`` (its updates
    appended after the last delivery it got)."""

    since: str
    through: str | None = None
    count: int = Field(ge=0, lt=2**53)
    hash: str = Field(pattern=r"^[0-9a-f]{32}$")

    _since = field_validator("since", "through")(_check_offset)


class Subscribe(_DocFrame):
    op: Literal["subscribe"]
    offset: str | None = None
    digest: WindowDigest | None = None

    _offset = field_validator("offset")(_check_offset)


class Unsubscribe(_DocFrame):
    op: Literal["unsubscribe"]


class Update(_DocFrame):
    op: Literal["update"]
    clock: int = Field(ge=0, lt=2**53)
    update: str
    #: A two-way sync's diff (feature ``sync_push``): the server stores the
    #: part the document can apply and reports the rest in ``appended.dropped``.
    sync: bool = False
    #: Feature ``update_parts``: this frame carries slice ``part`` of ``parts``
    #: of one update (same doc and clock on every part, sent in order).
    part: int | None = Field(default=None, ge=0, lt=2**16)
    parts: int | None = Field(default=None, ge=2, le=2**16)


class Ack(_DocFrame):
    op: Literal["ack"]
    offset: str

    _offset = field_validator("offset")(_check_offset)


class Sync(_DocFrame):
    op: Literal["sync"]
    state_vector: str


class CheckSubscriptions(_Frame):
    """The digest of the documents the client is subscribed to."""

    op: Literal["check_subscriptions"]
    count: int = Field(ge=0, lt=2**53)
    hash: str = Field(pattern=r"^[0-9a-f]{32}$")
    #: Echoed in the answer, so a late answer is never taken for a newer one.
    ref: int | None = Field(default=None, ge=0, lt=2**53)


class Reconcile(_Frame):
    """One range-reconciliation request (yrelay.reconciliation.messages), base64."""

    op: Literal["reconcile"]
    payload: str
    ref: int | None = Field(default=None, ge=0, lt=2**53)


class Ping(_Frame):
    op: Literal["ping"]


class Awareness(_DocFrame):
    """A y-protocols awareness update (``encodeAwarenessUpdate``), base64."""

    op: Literal["awareness"]
    update: str


class _HotFrame(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="op"):
    """The frames every update brings (an update and its readers' acks),
    decoded by msgspec: ~1 us against ~4-5 us for json.loads and the
    pydantic models. Strict types as in those models; anything these
    refuse goes the pydantic way, so every error frame stays what it was."""

    doc: str


class UpdateFrame(_HotFrame, tag="update", frozen=True):  # frozen as its base (mypy reads no inherited config)
    """:class:`Update`, decoded on the hot path (the same fields and bounds)."""

    clock: Annotated[int, msgspec.Meta(ge=0, lt=2**53)]
    update: str
    sync: bool = False
    part: Annotated[int, msgspec.Meta(ge=0, lt=2**16)] | None = None
    parts: Annotated[int, msgspec.Meta(ge=2, le=2**16)] | None = None


class AckFrame(_HotFrame, tag="ack", frozen=True):
    """:class:`Ack`, decoded on the hot path."""

    offset: str


_hot_frame: msgspec.json.Decoder[UpdateFrame | AckFrame] = msgspec.json.Decoder(UpdateFrame | AckFrame)
#: Either form of an update frame (the write path reads only its fields).
AnyUpdate: TypeAlias = Update | UpdateFrame


def _parse_hot_frame(text: str | bytes) -> UpdateFrame | AckFrame | None:
    """A valid ``update`` or ``ack`` frame, else None (the caller's pydantic
    parse then accepts it or names exactly what is wrong)."""
    try:
        frame = _hot_frame.decode(text)
    except msgspec.DecodeError:  # also ValidationError: another op, a wrong type, a bound
        return None
    if DOC_ID_PATTERN.fullmatch(frame.doc) is None:
        return None
    if type(frame) is AckFrame:
        try:
            StreamId.parse(frame.offset)
        except InvalidOffset:
            return None
    return frame


#: A client frame as pydantic validates it (on the op); the hot path reads
#: update and ack frames as an :class:`UpdateFrame` or :class:`AckFrame`.
ClientModel: TypeAlias = (
    Hello | Subscribe | Unsubscribe | Update | Ack | Sync | CheckSubscriptions | Reconcile | Ping | Awareness
)
ClientFrame = Annotated[ClientModel, Field(discriminator="op")]
_client_frame = TypeAdapter(ClientFrame)
#: Every client op: the ``op`` literal of each model.
CLIENT_OPS = {get_args(model.model_fields["op"].annotation)[0] for model in get_args(ClientModel)}


def parse_client_frame(text: str | bytes) -> ClientModel | UpdateFrame | AckFrame:
    """Decode and validate one client frame, or raise :class:`ProtocolError`.
    A valid ``update`` or ``ack`` comes back as an :class:`UpdateFrame` or
    :class:`AckFrame` (read fast); the same frame refused says why as before."""
    if _json_depth(text) > MAX_JSON_DEPTH:  # before json.loads, which recurses per level
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"frame nests deeper than {MAX_JSON_DEPTH} levels")
    hot = _parse_hot_frame(text)
    if hot is not None:
        return hot
    try:
        raw = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "frame is not valid JSON") from None
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "frame must be a JSON object")
    doc = raw.get("doc") if isinstance(raw.get("doc"), str) else None
    clock = raw.get("clock") if type(raw.get("clock")) is int else None
    op = raw.get("op")
    if not isinstance(op, str) or op not in CLIENT_OPS:
        raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown op {str(op)[:40]!r}", doc=doc, clock=clock)
    try:
        return _client_frame.validate_python(raw)
    except ValidationError as exc:
        raise _error_from_validation(exc, doc, clock) from None


#: Deepest nesting of arrays and objects in a client frame (real frames nest 2 deep).
MAX_JSON_DEPTH = 32
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def _json_depth(text: str | bytes) -> int:
    """The deepest nesting of ``text`` as JSON, at C speed (an upper bound
    for text that is not JSON, which json.loads then refuses anyway)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:  # every real frame: nothing to scan
        return 0
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)).encode()
    return max(itertools.accumulate(memoryview(brackets.translate(_BRACKET_STEP)).cast("b")), default=0)


def _error_from_validation(exc: ValidationError, doc: str | None, clock: int | None) -> ProtocolError:
    first = exc.errors(include_url=False, include_input=False)[0]
    field = ".".join(str(part) for part in first["loc"][1:]) or "frame"
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, InvalidDocumentId):
        return ProtocolError(ErrorCode.INVALID_DOC_ID, str(cause), clock=clock)
    if isinstance(cause, InvalidOffset):
        return ProtocolError(ErrorCode.INVALID_OFFSET, str(cause), doc=doc, clock=clock)
    return ProtocolError(ErrorCode.MALFORMED_FRAME, f"{field}: {first['msg']}", doc=doc, clock=clock)


# ---------------------------------------------------------------- server frames
# Built as plain dicts: they are produced on the hot path and never parsed here.


_encoder = msgspec.json.Encoder()


def encode(frame: dict[str, Any]) -> str:
    """One frame's text (msgspec: ~3x faster than json.dumps; non-ASCII stays UTF-8)."""
    return _encoder.encode(frame).decode()


def welcome(session: str, resumed: bool, limits: dict[str, float], auth: dict[str, Any]) -> dict[str, Any]:
    """``auth``: ``{mode, subject, permission}``; ``mode`` is ``disabled`` on a
    development server that checks nothing."""
    return {
        "op": "welcome",
        "session": session,
        "resumed": resumed,
        "protocol": PROTOCOL_VERSION,
        "limits": limits,
        "auth": auth,
        "features": list(FEATURES),
    }


def subscribed(doc: str, offset: str, digest: dict[str, Any] | None = None) -> dict[str, Any]:
    """``digest`` is the server's over ``(digest.since, offset]`` (see WindowDigest)."""
    frame: dict[str, Any] = {"op": "subscribed", "doc": doc, "offset": offset}
    if digest is not None:
        frame["digest"] = digest
    return frame


def unsubscribed(doc: str) -> dict[str, Any]:
    return {"op": "unsubscribed", "doc": doc}


def snapshot(doc: str, offset: str, update: bytes, part: int, parts: int) -> dict[str, Any]:
    return {"op": "snapshot", "doc": doc, "offset": offset, "update": b64encode(update), "part": part, "parts": parts}


def appended(
    doc: str, clock: int, entry_id: str | None, duplicate: bool, dropped: dict[int, list[tuple[int, int]]] | None = None
) -> dict[str, Any]:
    """``entry_id`` is None only for a sync push of which nothing could be
    stored; ``dropped`` lists, per Yjs client, the ``[start, end)`` clock
    ranges of a sync push the document cannot apply (they were not stored)."""
    frame = {"op": "appended", "doc": doc, "clock": clock, "id": entry_id, "duplicate": duplicate}
    if dropped:
        frame["dropped"] = {str(client): [list(r) for r in ranges] for client, ranges in dropped.items()}
    return frame


def synced(doc: str, offset: str) -> dict[str, Any]:
    """Sent once the subscriber has been sent everything the document had
    admitted when its subscribe (or sync) was answered, up to ``offset``."""
    return {"op": "synced", "doc": doc, "offset": offset}


def deliver(doc: str, entries: list[tuple[str, str]]) -> dict[str, Any]:
    """``entries`` are ``(stream id, base64 update)`` pairs in stream order."""
    return {"op": "deliver", "doc": doc, "entries": [{"id": i, "update": u} for i, u in entries]}


def resync_required(doc: str, reason: ResyncReason) -> dict[str, Any]:
    return {"op": "resync_required", "doc": doc, "reason": reason.value}


def sync_reply(doc: str, offset: str, update: bytes, state_vector: bytes, part: int, parts: int) -> dict[str, Any]:
    return {
        "op": "sync_reply",
        "doc": doc,
        "offset": offset,
        "update": b64encode(update),
        "state_vector": b64encode(state_vector),
        "part": part,
        "parts": parts,
    }


def subscriptions(digest: dict[str, Any], ref: int | None = None) -> dict[str, Any]:
    """The digest of the documents that track the session (``{count, hash}``)."""
    return _with_ref({"op": "subscriptions", **digest}, ref)


def reconcile_reply(payload: bytes, ref: int | None = None) -> dict[str, Any]:
    return _with_ref({"op": "reconcile_reply", "payload": b64encode(payload)}, ref)


def _with_ref(frame: dict[str, Any], ref: int | None) -> dict[str, Any]:
    if ref is not None:
        frame["ref"] = ref
    return frame


def error(error: ProtocolError) -> dict[str, Any]:
    frame: dict[str, Any] = {"op": "error", "code": error.code.value, "message": error.message}
    optional = {"doc": error.doc, "clock": error.clock, "retry_after_ms": error.retry_after_ms}
    frame.update((name, value) for name, value in optional.items() if value is not None)
    if error.missing is not None:
        frame["missing"] = {str(client): clock for client, clock in error.missing.items()}
    return frame


def awareness(doc: str, update: bytes) -> dict[str, Any]:
    """Other clients' presence: an awareness update to apply as is."""
    return {"op": "awareness", "doc": doc, "update": b64encode(update)}


def pong() -> dict[str, Any]:
    return {"op": "pong"}


def chunks(data: bytes, size: int) -> list[bytes]:
    """Split a large payload so no single frame carries more than ``size`` bytes."""
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]
