"""Bad input: a clear error, nothing stored, the server keeps serving."""

import base64
import json

import pytest

from conftest import running_server
from wsraw import RawPeer
from yrelay.yjs import crdt


def good_update(text: str = "ok") -> bytes:
    doc = crdt.new_doc(9)
    crdt.insert_text(doc, 0, text)
    return crdt.encode_state(doc)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


BAD_FRAMES = [
    ("{not json", "malformed_frame"),
    ("[1, 2]", "malformed_frame"),
    (json.dumps({"op": "launch"}), "unknown_op"),
    (json.dumps({"op": "update", "doc": "v", "clock": 1}), "malformed_frame"),
    (json.dumps({"op": "update", "doc": "v", "clock": "one", "update": "AA=="}), "malformed_frame"),
    (json.dumps({"op": "update", "doc": "v", "clock": 1, "update": "***"}), "malformed_frame"),
    (json.dumps({"op": "update", "doc": "v", "clock": 2, "update": b64(b"\xff\xfe\xfd\x01")}), "invalid_update"),
    (json.dumps({"op": "update", "doc": "v", "clock": 3, "update": b64(b"\x05")}), "invalid_update"),
    (json.dumps({"op": "update", "doc": "v", "clock": 4, "update": ""}), "invalid_update"),
    # strict types: never coerced (a coerced `true` once acked clock 1's entry for dropped bytes)
    (json.dumps({"op": "update", "doc": "v", "clock": True, "update": b64(good_update())}), "malformed_frame"),
    (json.dumps({"op": "update", "doc": "v", "clock": "93", "update": b64(good_update())}), "malformed_frame"),
    (json.dumps({"op": "update", "doc": "v", "clock": 1.0, "update": b64(good_update())}), "malformed_frame"),
    (json.dumps({"op": "update", "doc": "v", "clock": 8, "update": b64(good_update()), "sync": 1}), "malformed_frame"),
    (json.dumps({"op": "ack", "doc": "v", "offset": 5}), "malformed_frame"),
    (json.dumps({"op": "update", "doc": "a{b}", "clock": 6, "update": "AA=="}), "invalid_doc_id"),
    (json.dumps({"op": "subscribe", "doc": "x" * 201}), "invalid_doc_id"),
    (json.dumps({"op": "subscribe", "doc": ""}), "invalid_doc_id"),
    (json.dumps({"op": "subscribe", "doc": "v", "offset": "12-1000"}), "invalid_offset"),
    (json.dumps({"op": "subscribe", "doc": "v", "offset": "+"}), "invalid_offset"),
    (json.dumps({"op": "ack", "doc": "v", "offset": "abc"}), "invalid_offset"),
    (
        json.dumps({"op": "update", "doc": "unsubscribed-doc", "clock": 7, "update": b64(good_update())}),
        "not_subscribed",
    ),
    (json.dumps({"op": "sync", "doc": "v", "state_vector": b64(b"\xff\xff\xff")}), "malformed_frame"),
    (json.dumps({"op": "hello"}), "malformed_frame"),
]


def _update_named_by(frame: str) -> tuple[str, int] | None:
    """(doc, clock) of an update frame that names both with the right types."""
    try:
        raw = json.loads(frame)
    except ValueError:
        return None
    if isinstance(raw, dict) and raw.get("op") == "update" and type(raw.get("clock")) is int:
        return raw.get("doc"), raw["clock"]
    return None


@pytest.mark.parametrize("frame,code", BAD_FRAMES, ids=[code + str(i) for i, (_, code) in enumerate(BAD_FRAMES)])
async def test_bad_frame_gets_an_error_and_stores_nothing(server_url, redis_client, frame, code):
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "v"})
    await peer.expect("subscribed")
    await peer.send(frame)
    error = await peer.expect("error")
    assert error["code"] == code, error
    assert "Traceback" not in error["message"] and error["message"]
    named = _update_named_by(frame)
    if named is not None and code != "invalid_doc_id":  # every error about an update names it
        assert (error.get("doc"), error.get("clock")) == named, error
    assert await redis_client.xlen("yrelay:{v}:stream") == 0
    # same connection still works
    assert (await peer.update("v", 100, good_update()))["op"] == "appended"
    assert await redis_client.xlen("yrelay:{v}:stream") == 1


async def test_an_update_over_max_update_bytes_is_refused_with_its_doc_and_clock(redis_url, redis_client):
    async with running_server(redis_url, max_update_bytes=1_000_000) as url:
        peer = await RawPeer.connect(url)
        await peer.send({"op": "subscribe", "doc": "v"})
        await peer.expect("subscribed")
        await peer.send({"op": "update", "doc": "v", "clock": 5, "update": b64(b"\x01" * 1_100_000)})
        error = await peer.expect("error")
        assert (error["code"], error["doc"], error["clock"]) == ("update_too_large", "v", 5)
        assert await redis_client.xlen("yrelay:{v}:stream") == 0


async def test_hello_with_a_string_protocol_is_malformed(server_url):
    import websockets

    async with websockets.connect(server_url) as ws:
        await ws.send(json.dumps({"op": "hello", "protocol": "1"}))
        answer = json.loads(await ws.recv())
        assert (answer["op"], answer["code"]) == ("error", "malformed_frame")


async def test_frame_over_the_limit_is_refused_before_decoding(server_url):
    peer = await RawPeer.connect(server_url)
    await peer.send("x" * 1_600_000)
    assert (await peer.expect("error"))["code"] == "frame_too_large"
    await peer.send({"op": "ping"})
    await peer.expect("pong")


async def test_frames_before_hello_are_refused(server_url):
    import websockets

    async with websockets.connect(server_url) as ws:
        await ws.send(json.dumps({"op": "subscribe", "doc": "v"}))
        frame = json.loads(await ws.recv())
        assert frame["code"] == "handshake_required"
        await ws.send(b"\x00binary")
        assert json.loads(await ws.recv())["code"] == "malformed_frame"


async def test_unknown_session_gets_a_new_one(server_url):
    peer = await RawPeer.connect(server_url, session="A" * 24)
    assert peer.session != "A" * 24


async def test_a_broken_document_does_not_stop_the_others(server_url, redis_client, make_client):
    """y-redis lesson: one bad stream in a shared XREAD must not stop fan-out."""
    writer, reader = await make_client(server_url), await make_client(server_url)
    good_w = await writer.subscribe("good")
    good_r = await reader.subscribe("good")
    await reader.subscribe("bad")
    await redis_client.delete("yrelay:{bad}:stream")
    await redis_client.set("yrelay:{bad}:stream", "not a stream")  # poison the key
    crdt.insert_text(good_w.ydoc, 0, "still flowing")
    from conftest import eventually

    await eventually(lambda: good_r.text == "still flowing", timeout=10)
    await eventually(lambda: any(e.get("code") == "document_unavailable" for e in reader.errors), timeout=10)
