"""The client frame model (msgspec Structs, yrelay/protocol.py) against the
strict pydantic models it replaced, kept here as the reference: on any
text, it accepts exactly what they accepted, with the same fields, and
refuses with the same error code, doc and clock."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from yrelay import protocol
from yrelay.protocol import Ack, ErrorCode, Hello, ProtocolError, Update, parse_client_frame
from yrelay.storage.keys import InvalidDocumentId, validate_doc_id
from yrelay.storage.offsets import InvalidOffset, StreamId

FIELDS = ("doc", "clock", "update", "sync", "part", "parts", "offset")

values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-2, max_value=2**64),
    st.sampled_from([2**53 - 1, 2**53, 2**16]),
    st.floats(allow_nan=False),
    st.sampled_from(
        ["doc-1", "a/b@c", "", "has space", "{x}", "x" * 201, "1700000000000-5", "1-1000", "0-0", "AQE=", "\ud800", "é"]
    ),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)
frames = st.fixed_dictionaries(
    {"op": st.sampled_from(["update", "ack", "ping", "Update", 1])},
    optional={name: values for name in (*FIELDS, "extra")},
)


class _Reference(BaseModel):
    """The pydantic models ``parse_client_frame`` read before the one model."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _ReferenceDoc(_Reference):
    doc: str

    @field_validator("doc")
    @classmethod
    def _check_doc(cls, value: str) -> str:
        return validate_doc_id(value)


class _ReferenceUpdate(_ReferenceDoc):
    op: Literal["update"]
    clock: int = Field(ge=0, lt=2**53)
    update: str
    sync: bool = False
    part: int | None = Field(default=None, ge=0, lt=2**16)
    parts: int | None = Field(default=None, ge=2, le=2**16)


class _ReferenceAck(_ReferenceDoc):
    op: Literal["ack"]
    offset: str

    @field_validator("offset")
    @classmethod
    def _check_offset(cls, value: str) -> str:
        StreamId.parse(value)
        return value


class _ReferencePing(_Reference):
    op: Literal["ping"]


_reference = TypeAdapter(Annotated[_ReferenceUpdate | _ReferenceAck | _ReferencePing, Field(discriminator="op")])


def _reference_read(text: str) -> tuple[str, dict[str, object], str | None, int | None]:
    """``(code, fields, doc, clock)`` as the reference read ``text``
    (the code ``ok`` and the frame's fields when it is accepted)."""
    try:
        raw = json.loads(text)
    except ValueError:
        return "malformed_frame", {}, None, None
    if not isinstance(raw, dict):
        return "malformed_frame", {}, None, None
    doc = raw.get("doc") if isinstance(raw.get("doc"), str) else None
    if doc is not None and any("\ud800" <= char <= "\udfff" for char in doc):
        doc = None  # not echoed: no UTF-8 holds a lone surrogate (the models' error frame failed to send)
    clock = raw.get("clock") if type(raw.get("clock")) is int else None
    if raw.get("op") not in protocol.CLIENT_OPS:
        return "unknown_op", {}, doc, clock
    try:
        model = _reference.validate_python(raw)
    except ValidationError as exc:
        cause = exc.errors()[0].get("ctx", {}).get("error")
        if isinstance(cause, InvalidDocumentId):
            return "invalid_doc_id", {}, None, clock
        code = "invalid_offset" if isinstance(cause, InvalidOffset) else "malformed_frame"
        return code, {}, doc, clock
    return "ok", model.model_dump(exclude={"op"}), None, None


def _read(text: str) -> tuple[str, dict[str, object], str | None, int | None]:
    try:
        frame = parse_client_frame(text)
    except ProtocolError as refused:
        return refused.code.value, {}, refused.doc, refused.clock
    return "ok", {name: getattr(frame, name) for name in frame.__struct_fields__}, None, None


@settings(max_examples=3000, deadline=None)
@given(frames, st.booleans())
def test_the_model_accepts_and_refuses_exactly_as_the_pydantic_models_did(frame: dict[str, object], compact: bool):
    text = json.dumps(frame, separators=(",", ":") if compact else None)
    assert _read(text) == _reference_read(text), text


def _refusal(text: str) -> ProtocolError:
    try:
        parse_client_frame(text)
    except ProtocolError as refused:
        return refused
    raise AssertionError(f"accepted {text}")


def test_update_and_ack_are_read_by_the_hot_path():
    update = parse_client_frame('{"op":"update","doc":"d","clock":7,"update":"AQE=","part":0,"parts":2}')
    ack = parse_client_frame('{"op":"ack","doc":"d","offset":"1700000000000-3"}')
    assert update == Update(doc="d", clock=7, update="AQE=", part=0, parts=2)
    assert ack == Ack(doc="d", offset="1700000000000-3")


def test_refusals_keep_their_codes_and_messages():
    cases = {
        '{"op":"update","doc":"d","clock":true,"update":""}': (
            "malformed_frame",
            "clock: Input should be a valid integer",
        ),
        '{"op":"update","doc":"has space","clock":1,"update":""}': ("invalid_doc_id", "document ids are"),
        '{"op":"ack","doc":"d","offset":"1-1000"}': ("invalid_offset", "not a stream id"),
        '{"op":"ack","doc":"d","offset":"1-1","x":1}': ("malformed_frame", "x: Extra inputs are not permitted"),
        '{"op":"update","doc":"d","clock":9007199254740992,"update":""}': (
            "malformed_frame",
            "clock: Input should be less",
        ),
    }
    for text, (code, message) in cases.items():
        refused = _refusal(text)
        assert (refused.code.value, refused.message[: len(message)]) == (code, message), text


def test_every_op_refuses_its_first_wrong_field_by_name():
    """The other ops, nested fields, and a frame wrong twice (its first
    field in the frame's order decides, whatever the JSON's key order)."""
    digest = {"since": "1-1", "count": 1, "hash": "0" * 32}
    cases = [
        ({"op": "subscribe", "doc": "d", "digest": {**digest, "since": "1-1000"}}, "invalid_offset", "not a stream id"),
        ({"op": "subscribe", "doc": "d", "offset": "1-1", "digest": {**digest, "through": "x"}}, "invalid_offset", ""),
        ({"op": "subscribe", "doc": "d", "offset": "+", "digest": 5}, "invalid_offset", ""),
        ({"op": "subscribe", "doc": "d", "digest": {**digest, "count": -1}}, "malformed_frame", "digest.count: "),
        ({"op": "subscribe", "doc": "d", "digest": {"since": "1-1", "count": 1}}, "malformed_frame", "digest.hash: "),
        ({"op": "subscribe", "doc": "d", "digest": {**digest, "x": 1}}, "malformed_frame", "digest.x: Extra"),
        ({"op": "subscribe", "doc": "d", "digest": [1]}, "malformed_frame", "digest: "),
        ({"op": "check_subscriptions", "count": 0, "hash": "0" * 31 + "\n"}, "malformed_frame", "hash: "),
        ({"op": "check_subscriptions", "count": 0, "hash": "0" * 32, "ref": 2**53}, "malformed_frame", "ref: "),
        ({"op": "reconcile", "payload": 5}, "malformed_frame", "payload: Input should be a valid string"),
        ({"op": "hello", "token": "x" * 16_385}, "malformed_frame", "token: String should have at most 16384"),
        ({"op": "hello", "protocol": "1"}, "malformed_frame", "protocol: Input should be a valid integer"),
        ({"op": "sync", "doc": "d"}, "malformed_frame", "state_vector: Field required"),
        ({"op": "awareness", "doc": "d", "update": "AA==", "clock": 1}, "malformed_frame", "clock: Extra"),
        ({"op": "unsubscribe", "doc": "a{b}"}, "invalid_doc_id", "document ids are"),
        ({"op": "ack", "offset": "1-1000"}, "malformed_frame", "doc: Field required"),
        ({"clock": True, "doc": "has space", "op": "update", "update": ""}, "invalid_doc_id", ""),
        ({"offset": "bad", "x": 1, "op": "ack", "doc": "d"}, "invalid_offset", "not a stream id"),
        ({"op": "launch"}, "unknown_op", "unknown op 'launch'"),
    ]
    for frame, code, message in cases:
        refused = _refusal(json.dumps(frame))
        assert (refused.code.value, refused.message[: len(message)]) == (code, message), frame


def test_json_only_python_reads_is_judged_by_the_same_model():
    """A lone UTF-16 surrogate escape (msgspec's parser refuses it) and NaN:
    read as Python's json reads them, as the frames always were."""
    update = parse_client_frame('{"op":"update","doc":"d","clock":1,"update":"\\ud800"}')
    assert update == Update(doc="d", clock=1, update="\ud800")
    for text, code, doc in (
        ('{"op":"subscribe","doc":"\\ud800"}', ErrorCode.INVALID_DOC_ID, None),
        ('{"op":"update","doc":"d","clock":NaN,"update":""}', ErrorCode.MALFORMED_FRAME, "d"),
        ('{"op":"launch","doc":"\\ud800"}', ErrorCode.UNKNOWN_OP, None),
        ('{"op":"ping","\\ud800":1}', ErrorCode.MALFORMED_FRAME, None),
    ):
        refused = _refusal(text)
        assert (refused.code, refused.doc) == (code, doc), text
        protocol.encode(protocol.error(refused))  # UTF-8 holds the error frame: no lone surrogate is echoed


def test_the_token_stays_out_of_a_hellos_repr():
    hello = parse_client_frame('{"op":"hello","token":"s3cret-token"}')
    assert isinstance(hello, Hello) and hello.token == "s3cret-token"
    assert "s3cret" not in repr(hello)


def test_frames_encode_as_compact_json():
    text = protocol.encode(protocol.appended("d-é", 3, "1-2", False))
    assert text == '{"op":"appended","doc":"d-é","clock":3,"id":"1-2","duplicate":false}'
    assert json.loads(
        protocol.encode(protocol.error(ProtocolError(protocol.ErrorCode.MISSING_DEPENDENCY, "m", missing={5: 2})))
    )["missing"] == {"5": 2}


def test_a_prepared_frame_is_the_frame_websockets_would_send() -> None:
    """One framing for every reader (yrelay/app/prepared_frames.py): byte for
    byte what websockets frames for a server's text message, at every length
    encoding (7-bit, 16-bit, 64-bit)."""
    from websockets.frames import Frame, Opcode

    from yrelay.transport.prepared_frames import text_frame

    for size in (0, 5, 125, 126, 65_535, 65_536, 70_000):
        text = "é" * (size // 2) + "x" * (size % 2)
        expected = Frame(Opcode.TEXT, text.encode()).serialize(mask=False)
        assert text_frame(text) == expected, size


def test_prepared_frames_are_used_only_when_nothing_wraps_send() -> None:
    """Middleware that wraps ``send`` (an embedding app's telemetry) would not
    see a prepared frame: then there is no writer, and every frame goes through ``send``."""
    from yrelay.transport.prepared_frames import PREPARED_FRAMES, prepared_writer

    class Protocol:
        def write_prepared(self, frame: bytes) -> bool:
            return True

        async def send(self, message: dict) -> None:
            pass

    protocol = Protocol()
    scope = {"extensions": {PREPARED_FRAMES: protocol.write_prepared}}

    async def wrapped(message: dict) -> None:
        await protocol.send(message)

    assert prepared_writer(scope, protocol.send) == protocol.write_prepared
    assert prepared_writer(scope, wrapped) is None
    assert prepared_writer({"extensions": {}}, protocol.send) is None
    assert prepared_writer({}, protocol.send) is None
    assert prepared_writer(scope, Protocol().send) is None  # another connection's send
