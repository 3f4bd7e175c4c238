"""Bad input: a clear error, nothing stored, the server keeps serving."""

import base64
import json

import pytest
from wsraw import RawPeer

from yrelay import crdt


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
    (json.dumps({"op": "update", "doc": "v", "clock": 5, "update": b64(b"\x01" * 1_100_000)}), "update_too_large"),
    (json.dumps({"op": "update", "doc": "a{b}", "clock": 6, "update": "AA=="}), "invalid_doc_id"),
    (json.dumps({"op": "subscribe", "doc": "x" * 201}), "invalid_doc_id"),
    (json.dumps({"op": "subscribe", "doc": ""}), "invalid_doc_id"),
    (json.dumps({"op": "subscribe", "doc": "v", "offset": "12-1000"}), "invalid_offset"),
    (json.dumps({"op": "subscribe", "doc": "v", "offset": "+"}), "invalid_offset"),
    (json.dumps({"op": "ack", "doc": "v", "offset": "abc"}), "invalid_offset"),
    (json.dumps({"op": "update", "doc": "unsubscribed-doc", "clock": 7, "update": b64(good_update())}), "not_subscribed"),
    (json.dumps({"op": "sync", "doc": "v", "state_vector": b64(b"\xff\xff\xff")}), "malformed_frame"),
    (json.dumps({"op": "hello"}), "malformed_frame"),
]


@pytest.mark.parametrize("frame,code", BAD_FRAMES, ids=[code + str(i) for i, (_, code) in enumerate(BAD_FRAMES)])
async def test_bad_frame_gets_an_error_and_stores_nothing(server_url, redis_client, frame, code):
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "v"})
    await peer.expect("subscribed")
    await peer.send(frame)
    error = await peer.expect("error")
    assert error["code"] == code, error
    assert "Traceback" not in error["message"] and error["message"]
    assert await redis_client.xlen("yrelay:{v}:stream") == 0
    # same connection still works
    assert (await peer.update("v", 100, good_update()))["op"] == "appended"
    assert await redis_client.xlen("yrelay:{v}:stream") == 1


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
