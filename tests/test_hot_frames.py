"""The hot-path decoder of ``update`` and ``ack`` frames (msgspec) against
the pydantic models it stands in for: on any text, it accepts exactly what
they accept, with the same fields, and leaves every refusal to them (so
the error frame is what it always was)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from yrelay import protocol
from yrelay.protocol import Ack, AckFrame, ProtocolError, Update, UpdateFrame, parse_client_frame

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


def _pydantic(text: str) -> object:
    """What ``parse_client_frame`` returned before the hot path: the pydantic models."""
    try:
        return protocol._client_frame.validate_json(text) if json.loads(text) else None
    except ValueError:  # invalid JSON, or pydantic's ValidationError (a ValueError)
        return None


@settings(max_examples=3000, deadline=None)
@given(frames, st.booleans())
def test_hot_path_accepts_exactly_what_the_models_accept(frame: dict[str, object], compact: bool):
    text = json.dumps(frame, separators=(",", ":") if compact else None)
    hot = protocol._parse_hot_frame(text)
    try:
        full = parse_client_frame(text)
    except ProtocolError:
        full = None
    if hot is None:
        assert not isinstance(full, (UpdateFrame, AckFrame))  # refused: the pydantic way decides
        return
    assert isinstance(full, (UpdateFrame, AckFrame)) and full == hot
    model = Update if isinstance(hot, UpdateFrame) else Ack
    expected = model.model_validate(json.loads(text), strict=True)
    assert all(getattr(hot, name) == getattr(expected, name) for name in FIELDS if hasattr(expected, name))


def test_update_and_ack_are_read_by_the_hot_path():
    update = parse_client_frame('{"op":"update","doc":"d","clock":7,"update":"AQE=","part":0,"parts":2}')
    ack = parse_client_frame('{"op":"ack","doc":"d","offset":"1700000000000-3"}')
    assert update == UpdateFrame(doc="d", clock=7, update="AQE=", part=0, parts=2)
    assert ack == AckFrame(doc="d", offset="1700000000000-3")


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
        try:
            parse_client_frame(text)
        except ProtocolError as refused:
            assert (refused.code.value, refused.message[: len(message)]) == (code, message), text
        else:
            raise AssertionError(f"accepted {text}")


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
