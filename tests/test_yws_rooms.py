"""Any y-websocket room name (issue 36): every name that fits maps
one-to-one to a document id (``%XX`` escapes, no braces), the same id that
tokens, ``/ops`` and the event log name; one that cannot fit is refused
once, with the socket kept open (tests/test_yws_versions.py runs the stock
clients of each version)."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import quote

import httpx
import pytest
import websockets
from hypothesis import given
from hypothesis import strategies as st

from conftest import eventually, running_server
from yrelay.auth import issue_token
from yrelay.storage.keys import DOC_ID_PATTERN, InvalidDocumentId, doc_id_room, room_doc_id, validate_doc_id
from yrelay.yjs import yprotocol
from yrelay.yjs.yprotocol import AuthMessage, AwarenessMessage
from ywspeer import REFUSED_AFTER_ACCEPT, YwsPeer

SECRET = "yws-rooms-secret-0123456789abcdef0123456"
KEEPALIVE = 0.3  # yws_echo_after: how often a refused socket hears the empty awareness update


@given(st.text(min_size=1, max_size=70))
def test_every_room_that_fits_round_trips_to_a_valid_id_without_braces(room):
    try:
        data = room.encode()
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 bytes
        data = None
    size = (
        None
        if data is None
        else sum(1 if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "._-:/@") else 3 for b in data)
    )
    if size is None or size > 200:
        with pytest.raises(InvalidDocumentId):
            room_doc_id(room)
        return
    doc = room_doc_id(room)
    assert DOC_ID_PATTERN.fullmatch(doc) and doc_id_room(doc) == room and len(doc) == size
    assert "{" not in doc and "}" not in doc


@given(st.text(max_size=30), st.text(max_size=30))
def test_two_rooms_never_share_an_id(a, b):
    ids = []
    for room in (a, b):
        try:
            ids.append(room_doc_id(room))
        except InvalidDocumentId:
            return
    assert (ids[0] == ids[1]) == (a == b)


def test_examples_and_the_rooms_no_id_can_hold():
    assert room_doc_id("team-7/notes") == "team-7/notes"  # a valid id without % stays itself
    assert room_doc_id("my room") == "my%20room"
    assert room_doc_id("100%") == "100%25"
    assert room_doc_id("{tag}") == "%7Btag%7D"
    assert room_doc_id("café") == "caf%C3%A9"
    assert room_doc_id("é" * 33) == "%C3%A9" * 33  # 198 characters
    for room in ("", "x" * 201, "é" * 34, "\ud800"):
        with pytest.raises(InvalidDocumentId):
            room_doc_id(room)
    for doc in ("my%20room", "%7B", "a" * 200):
        assert validate_doc_id(doc) == doc
    for doc in ("100%", "%2f", "%7", "a{b}", "a" * 201, "%20" * 67):
        with pytest.raises(InvalidDocumentId):
            validate_doc_id(doc)


async def test_a_room_meets_its_id_however_the_url_spells_it(redis_url, make_client):
    async with running_server(redis_url) as url:
        base = url.removesuffix("/ws")
        raw = await YwsPeer.connect(base, "café {1}")  # websockets sends what the URL parser makes of it
        encoded = await YwsPeer.connect(base, quote("café {1}", safe=""))  # an app's encodeURIComponent(room)
        await raw.edit("both ")
        await eventually(lambda: str(encoded.text) == "both ")
        by_id = await (await make_client(url)).subscribe(room_doc_id("café {1}"))  # /ws names the id itself
        await eventually(lambda: by_id.text == "both ")
        other = await YwsPeer.connect(base, quote(room_doc_id("café {1}"), safe=""))  # the room "caf%C3%A9..."
        assert str(other.text) == ""  # is another room: % is escaped too
        for peer in (raw, encoded, other):
            assert peer.closed is None
            await peer.close()


async def test_a_grant_names_the_rooms_id(redis_url):
    token = issue_token(SECRET, "team", ["team%207/*"], "write")
    async with running_server(redis_url, insecure_no_auth=False, auth_secret=SECRET) as url:
        base = url.removesuffix("/ws")
        peer = await YwsPeer.connect(base, f"{quote('team 7/notes')}?token={token}")
        await peer.edit("granted")
        assert peer.closed is None and not peer.denied
        with pytest.raises(REFUSED_AFTER_ACCEPT):  # "team 8/..." is another prefix
            await YwsPeer.connect(base, f"{quote('team 8/notes')}?token={token}")
        await peer.close()


async def test_a_room_no_id_can_hold_is_refused_once_and_the_socket_stays(redis_url):
    async with running_server(redis_url, yws_echo_after=KEEPALIVE) as url:
        heard: list[object] = []
        async with websockets.connect(f"{url.removesuffix('/ws')}/yws/{'r' * 300}") as ws:
            await ws.send(yprotocol.sync_step1(b"\x00"))
            while sum(isinstance(message, AwarenessMessage) for message in heard) < 3:
                heard.append(yprotocol.decode(await asyncio.wait_for(ws.recv(), 30)))
            assert isinstance(heard[0], AuthMessage) and "at most 200" in heard[0].reason
            assert all(message.update == b"\x00" for message in heard[1:])  # an awareness update of no client
            assert len(heard) == 4 and ws.close_code is None  # denied once, nothing synced, still open


async def test_a_held_socket_is_closed_once_its_token_is_revoked(redis_url):
    """A refused room's socket stays open, but not past its token: revoked
    (or expired), it is closed with 4401 as a served one is, so a held
    socket is no way to outlive a token."""
    token = issue_token(SECRET, "held", ["*"], "read", token_id="held-1")
    async with running_server(
        redis_url,
        insecure_no_auth=False,
        auth_secret=SECRET,
        ops_token="ops",
        revocation_refresh=0.2,
        yws_echo_after=KEEPALIVE,
    ) as url:
        async with websockets.connect(f"{url.removesuffix('/ws')}/yws/{'r' * 300}?token={token}") as ws:
            first = yprotocol.decode(await asyncio.wait_for(ws.recv(), 30))
            assert isinstance(first, AuthMessage) and "at most 200" in first.reason
            async with httpx.AsyncClient(
                base_url=url.replace("ws://", "http://").removesuffix("/ws"), timeout=30
            ) as http:
                answer = await http.post(
                    "/ops/tokens/revoke",
                    json={"jti": "held-1", "expires_at": time.time() + 600},
                    headers={"Authorization": "Bearer ops"},
                )
                assert answer.status_code == 204
            with pytest.raises(websockets.ConnectionClosed):
                while True:
                    await asyncio.wait_for(ws.recv(), 30)  # empty awareness updates until the close
            assert ws.close_code == 4401 and ws.close_reason == "the token was revoked"


async def test_a_url_escaping_bytes_that_are_not_utf8_names_no_room(redis_url, redis_client):
    """The server decodes ``%FF`` (not UTF-8) as U+FFFD: every such URL
    (``%FF``, ``%FE``) shared the document of the room U+FFFD. It is
    refused once and held instead; the room U+FFFD itself is served."""
    async with running_server(redis_url, yws_echo_after=KEEPALIVE) as url:
        base = url.removesuffix("/ws")
        for path in ("%FF", "a%FEb", "%EF%BF%BD%C3"):
            async with websockets.connect(f"{base}/yws/{path}") as ws:
                first = yprotocol.decode(await asyncio.wait_for(ws.recv(), 30))
                assert isinstance(first, AuthMessage) and "Unicode" in first.reason, path
        replacement = await YwsPeer.connect(base, "%EF%BF%BD")
        await replacement.edit("kept")
        other = await YwsPeer.connect(base, quote("\ufffd"))  # the same room, spelled by the URL parser
        await eventually(lambda: str(other.text) == "kept")
        assert replacement.closed is None and not replacement.denied
        for peer in (replacement, other):
            await peer.close()
        assert sorted(await redis_client.keys("yrelay:*:stream")) == [b"yrelay:{%EF%BF%BD}:stream"]
