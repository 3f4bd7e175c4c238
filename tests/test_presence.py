"""Presence (Yjs awareness): the wire codec, and the relay over a real
server and a real redis-server."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import running_server
from wsraw import RawPeer
from yrelay.storage.embedded import RedisProcess
from yrelay.yjs.awareness import MAX_UINT, AwarenessEntry, AwarenessError, decode_update, encode_update

# ------------------------------------------------------------------ codec

USER_A = '{"user":{"name":"a"}}'


def test_a_known_y_protocols_update_encodes_to_its_exact_bytes():
    text = USER_A.encode()
    expected = bytes([1, 1, 2, len(text)]) + text  # count, clientID, clock, varstring
    assert encode_update([AwarenessEntry(1, 2, USER_A)]) == expected
    assert decode_update(expected) == [AwarenessEntry(1, 2, USER_A)]


def test_varuints_are_lib0_little_endian_groups_of_seven():
    assert encode_update([AwarenessEntry(300, 128, "null")]) == bytes([1, 0xAC, 0x02, 0x80, 0x01, 4]) + b"null"
    assert decode_update(bytes([1, 0xAC, 0x02, 0x80, 0x01, 4]) + b"null")[0].removed


states = st.one_of(
    st.just("null"),
    st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=8), st.booleans()), max_size=4).map(
        lambda value: json.dumps(value, ensure_ascii=False)
    ),
)
entries = st.builds(AwarenessEntry, st.integers(0, MAX_UINT), st.integers(0, MAX_UINT), states)


@given(st.lists(entries, max_size=16))
def test_decode_inverts_encode(items: list[AwarenessEntry]):
    assert decode_update(encode_update(items)) == items


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "ends inside a number"),
        (bytes([1, 1, 2, 10]) + b'{"a":1}', "ends inside a state"),
        (bytes([1, 1, 2, 4]) + b"null" + b"x", "trailing bytes"),
        (bytes([17]) + bytes([1, 1, 4]) + b"null", "at most 16 entries"),
        (bytes([1, 1, 2, 3]) + b"{a}", "not valid JSON"),
        (bytes([1, 1, 2, 3]) + b"[1]", "JSON object or null"),
        (bytes([1, 1, 2, 7]) + b'{"a":N}', "not valid JSON"),
        (bytes([1, 1, 2, 9]) + b'{"a":NaN}', "not valid JSON"),
        (bytes([1, 1, 2, 2]) + b"\xff\xfe", "not UTF-8"),
        (bytes([1]) + bytes([0xFF] * 8) + bytes([0x7F]), "2^53"),
    ],
)
def test_bad_updates_are_refused(data: bytes, reason: str):
    with pytest.raises(AwarenessError, match=reason.replace("^", r"\^")):
        decode_update(data)


# ------------------------------------------------------------------ relay

DOC = "pad"


def update_b64(*items: AwarenessEntry) -> str:
    return base64.b64encode(encode_update(items)).decode()


def state(name: str) -> str:
    return json.dumps({"user": {"name": name}})


def received(frame: dict[str, Any]) -> list[AwarenessEntry]:
    assert frame["op"] == "awareness", frame
    return decode_update(base64.b64decode(frame["update"]))


async def join(url: str, doc: str = DOC, address: str | None = None) -> RawPeer:
    peer = await RawPeer.connect(url, address=address)
    await peer.send({"op": "subscribe", "doc": doc})
    await peer.expect("subscribed")
    peer.clocks = {}  # type: ignore[attr-defined]
    return peer


async def changes(peer: RawPeer, timeout: float = 5.0) -> list[AwarenessEntry]:
    """The next entries that change what ``peer`` knows, as y-protocols
    applies them: a state the peer already has at that clock is skipped (a
    newcomer may get one both in its greeting and relayed)."""
    while True:
        frame = await peer.recv(timeout)
        fresh = [entry for entry in received(frame) if is_change(peer, entry)]
        present = peer.__dict__.setdefault("present", set())
        for entry in fresh:
            peer.clocks[entry.client_id] = entry.clock
            (present.discard if entry.removed else present.add)(entry.client_id)
        if fresh:
            return fresh


def is_change(peer: RawPeer, entry: AwarenessEntry) -> bool:
    """y-protocols' rule: a newer clock, or a null at the clock of a state held."""
    known = peer.clocks.get(entry.client_id, -1)  # type: ignore[attr-defined]
    held = entry.client_id in peer.__dict__.get("present", ())
    return entry.clock > known or (entry.removed and entry.clock == known and held)


async def error_of(peer: RawPeer) -> dict[str, Any]:
    """The next error frame (awareness frames that arrive first are skipped)."""
    while (frame := await peer.recv())["op"] == "awareness":
        pass
    assert frame["op"] == "error", frame
    return frame


async def no_changes(peer: RawPeer, timeout: float = 0.3) -> None:
    try:
        fresh = await changes(peer, timeout)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected awareness entries {fresh}")


async def announce(peer: RawPeer, *items: AwarenessEntry, doc: str = DOC) -> None:
    await peer.send({"op": "awareness", "doc": doc, "update": update_b64(*items)})


async def settled(peer: RawPeer) -> None:
    """Every frame the server sent before now has arrived (a ping's answer is
    queued behind them)."""
    await peer.send({"op": "ping"})
    while (frame := await peer.recv())["op"] != "pong":
        assert not [e for e in received(frame) if is_change(peer, e)], frame


async def test_two_peers_see_each_other_and_the_sender_gets_no_echo(server_url):
    alice, bob = await join(server_url), await join(server_url)
    await announce(alice, AwarenessEntry(11, 1, state("alice")))
    assert await changes(bob) == [AwarenessEntry(11, 1, state("alice"))]
    await announce(bob, AwarenessEntry(22, 5, state("bob")))
    assert await changes(alice) == [AwarenessEntry(22, 5, state("bob"))]
    await settled(alice)
    await settled(bob)


async def test_a_newcomer_gets_the_current_states_of_the_others(server_url):
    alice, bob = await join(server_url), await join(server_url)
    await announce(alice, AwarenessEntry(11, 1, state("old")))
    await announce(alice, AwarenessEntry(11, 2, state("alice")))
    await announce(bob, AwarenessEntry(22, 1, state("bob")))
    await changes(bob)
    await changes(bob)
    await changes(alice)
    carol = await join(server_url)
    greeting = await changes(carol)
    assert sorted(greeting, key=lambda e: e.client_id) == [
        AwarenessEntry(11, 2, state("alice")),
        AwarenessEntry(22, 1, state("bob")),
    ]
    # and carol does not get her own state back when she announces herself
    await announce(carol, AwarenessEntry(33, 1, state("carol")))
    await settled(carol)


async def test_a_subscribe_answered_with_resync_required_is_greeted_too(server_url):
    alice = await join(server_url)
    await announce(alice, AwarenessEntry(11, 1, state("alice")))
    await settled(alice)
    bob = await RawPeer.connect(server_url)
    bob.clocks = {}  # type: ignore[attr-defined]
    await bob.send({"op": "subscribe", "doc": DOC, "offset": "9999999999999-0"})  # ahead of the stream
    assert (await bob.expect("resync_required"))["reason"] == "ahead"
    assert await changes(bob) == [AwarenessEntry(11, 1, state("alice"))]


async def test_a_newcomer_without_others_gets_no_awareness_frame(server_url):
    alone = await join(server_url)
    await announce(alone, AwarenessEntry(11, 1, state("alone")))
    await settled(alone)
    await alone.send({"op": "unsubscribe", "doc": DOC})
    await alone.expect("unsubscribed")
    await alone.send({"op": "subscribe", "doc": DOC})
    await alone.expect("subscribed")
    await settled(alone)


async def test_unsubscribe_relays_a_removal_at_the_clients_clock(server_url, redis_client):
    alice, bob = await join(server_url), await join(server_url)
    await announce(alice, AwarenessEntry(11, 7, state("alice")))
    await changes(bob)
    await alice.send({"op": "unsubscribe", "doc": DOC})
    await alice.expect("unsubscribed")
    assert await changes(bob) == [AwarenessEntry(11, 7, "null")]
    assert await redis_client.hlen("yrelay:{pad}:presence") == 0
    carol = await join(server_url)
    await settled(carol)  # nobody left to greet her with


async def test_closing_the_connection_relays_a_removal(server_url):
    alice, bob = await join(server_url), await join(server_url)
    await announce(alice, AwarenessEntry(11, 3, state("alice")), AwarenessEntry(12, 1, state("alice 2")))
    await changes(bob)
    await alice.close()
    assert sorted(await changes(bob), key=lambda e: e.client_id) == [
        AwarenessEntry(11, 3, "null"),
        AwarenessEntry(12, 1, "null"),
    ]


async def test_a_client_removing_its_own_state_is_relayed_and_forgotten(server_url):
    alice, bob = await join(server_url), await join(server_url)
    await announce(alice, AwarenessEntry(11, 1, state("alice")))
    await changes(bob)
    await announce(alice, AwarenessEntry(11, 2, "null"))
    assert await changes(bob) == [AwarenessEntry(11, 2, "null")]
    await alice.close()  # nothing more to remove
    await no_changes(bob, 0.3)


async def test_a_peer_on_another_document_sees_nothing(server_url):
    alice, other = await join(server_url), await join(server_url, "elsewhere")
    bob = await join(server_url)
    await announce(alice, AwarenessEntry(11, 1, state("alice")))
    await changes(bob)
    await alice.close()
    await changes(bob)
    await no_changes(other, 0.3)


async def test_two_server_processes_on_one_redis_relay_to_each_other(redis_url):
    async with running_server(redis_url) as one, running_server(redis_url) as two:
        alice, bob = await join(one), await join(two)
        await announce(alice, AwarenessEntry(11, 1, state("alice")))
        assert await changes(bob) == [AwarenessEntry(11, 1, state("alice"))]
        await announce(bob, AwarenessEntry(22, 1, state("bob")))
        assert await changes(alice) == [AwarenessEntry(22, 1, state("bob"))]
        carol = await join(two)
        assert {e.client_id for e in await changes(carol)} == {11, 22}
        await alice.close()
        assert await changes(bob) == [AwarenessEntry(11, 1, "null")]
        assert await changes(carol) == [AwarenessEntry(11, 1, "null")]
        await settled(bob)
        await bob.close()
        await carol.close()


@pytest.mark.parametrize(
    "update, code",
    [
        ("not base64!", "malformed_frame"),
        (base64.b64encode(b"\x05\x01").decode(), "malformed_frame"),
        (base64.b64encode(bytes([1, 1, 1, 3]) + b"{a}").decode(), "malformed_frame"),
        (base64.b64encode(bytes([1, 1, 1, 1]) + b"7").decode(), "malformed_frame"),
        (base64.b64encode(bytes([17]) + bytes([1, 1, 4]) * 17).decode(), "malformed_frame"),
        (update_b64(AwarenessEntry(11, 1, json.dumps({"big": "x" * 40_000}))), "awareness_too_large"),
    ],
)
async def test_bad_awareness_updates_are_rejected_and_not_relayed(server_url, update, code):
    alice, bob = await join(server_url), await join(server_url)
    await alice.send({"op": "awareness", "doc": DOC, "update": update})
    error = await error_of(alice)
    assert error["code"] == code and error["doc"] == DOC, error
    await no_changes(bob, 0.3)


async def test_the_size_limit_is_a_setting(redis_url):
    async with running_server(redis_url, max_awareness_bytes=100) as url:
        alice = await join(url)
        await announce(alice, AwarenessEntry(11, 1, json.dumps({"x": "y" * 100})))
        assert (await error_of(alice))["code"] == "awareness_too_large"
        await announce(alice, AwarenessEntry(11, 1, state("small")))
        await settled(alice)


async def test_awareness_for_a_document_not_subscribed_is_rejected(server_url):
    alice, bob = await join(server_url), await join(server_url)
    await announce(alice, AwarenessEntry(11, 1, state("alice")), doc="elsewhere")
    error = await error_of(alice)
    assert error["code"] == "not_subscribed" and error["doc"] == "elsewhere"
    await no_changes(bob, 0.3)


#: Servers that take the client address from X-Forwarded-For (the tests' peers all come from 127.0.0.1).
BEHIND_PROXY = {"trusted_proxies": ("127.0.0.0/8",)}


async def test_another_address_cannot_speak_for_a_client_with_auth_off(redis_url):
    """With auth off the only identity is the client address (as the server
    sees it: behind a trusted proxy, X-Forwarded-For): a clientID belongs to
    the address that announced it, and a connection from any other address
    is refused it, on any process."""
    async with running_server(redis_url, **BEHIND_PROXY) as one, running_server(redis_url, **BEHIND_PROXY) as two:
        alice = await join(one, address="203.0.113.1")
        mallory, bob = await join(one, address="203.0.113.66"), await join(two, address="203.0.113.2")
        await announce(alice, AwarenessEntry(11, 1, state("alice")))
        await changes(mallory)
        await changes(bob)
        eve = await join(two, address="198.51.100.7")  # on the other process
        await changes(eve)  # the greeting
        for spoofer in (mallory, eve):
            await announce(spoofer, AwarenessEntry(11, 2, "null"))
            error = await error_of(spoofer)
            assert error["code"] == "awareness_not_owner" and error["doc"] == DOC and "11" in error["message"]
        # a frame with one refused entry is refused whole
        await announce(mallory, AwarenessEntry(66, 1, state("m")), AwarenessEntry(11, 9, state("fake")))
        assert (await error_of(mallory))["code"] == "awareness_not_owner"
        await no_changes(alice, 0.3)
        await no_changes(bob, 0.1)
        # once alice left, her clientID stays hers for the presence timeout
        # (test_a_clientid_waits_for_its_user_after_leaving)
        await alice.close()
        await changes(bob)
        await announce(mallory, AwarenessEntry(11, 5, state("new owner")))
        assert (await error_of(mallory))["code"] == "awareness_not_owner"
        await no_changes(bob, 0.3)


async def test_a_reconnecting_session_takes_its_client_over(server_url):
    """A browser whose old connection the server has not seen die yet gets
    its clientID back on its new connection (same session)."""
    alice, bob = await join(server_url), await join(server_url)
    await announce(alice, AwarenessEntry(11, 1, state("alice")))
    await changes(bob)
    again = await RawPeer.connect(server_url, session=alice.session)
    await again.send({"op": "subscribe", "doc": DOC})
    await again.expect("subscribed")
    await announce(again, AwarenessEntry(11, 2, state("alice again")))
    assert await changes(bob) == [AwarenessEntry(11, 2, state("alice again"))]
    await alice.close()  # the old connection's goodbye must not remove the new state
    await no_changes(bob, 0.3)
    await settled(again)


async def test_the_same_address_takes_its_client_back_with_auth_off(redis_url):
    """Issue 36: a stock client reconnecting after a server restart is a new
    session; with auth off, the same address gets its clientID back at once
    (while the claim keeps it from other addresses for the presence timeout)."""
    async with running_server(redis_url, **BEHIND_PROXY) as url:
        alice, bob = await join(url, address="203.0.113.1"), await join(url, address="203.0.113.2")
        await announce(alice, AwarenessEntry(11, 1, state("alice")))
        await changes(bob)
        await alice.close()
        assert await changes(bob) == [AwarenessEntry(11, 1, "null")]  # at her clock, as y-websocket's server does
        back = await join(url, address="203.0.113.1")  # a new session, no token: only the address says who
        assert back.session != alice.session
        await announce(back, AwarenessEntry(11, 1, state("alice")))  # a stock client re-sends its state as it was
        await announce(back, AwarenessEntry(11, 2, state("alice")))  # ... and renews it within 15 s
        # bob, as y-protocols, ignores the clock he holds and takes the renewal
        # (after a removal at clock + 1 he ignored both: one renewal more unseen)
        assert await changes(bob) == [AwarenessEntry(11, 2, state("alice"))]
        await settled(back)


async def test_states_not_renewed_within_the_timeout_are_not_sent_to_newcomers(redis_url, redis_client):
    async with running_server(redis_url, presence_timeout=0.3) as url:
        alice = await join(url)
        await announce(alice, AwarenessEntry(11, 1, state("alice")))
        await settled(alice)
        await asyncio.sleep(0.5)
        bob = await join(url)
        await settled(bob)
        assert await redis_client.hlen("yrelay:{pad}:presence") == 0
        await announce(alice, AwarenessEntry(11, 2, state("alice")))  # renewed: seen again
        assert await changes(bob) == [AwarenessEntry(11, 2, state("alice"))]
        assert 0 < await redis_client.pttl("yrelay:{pad}:presence") <= 300


async def test_presence_never_touches_the_document(server_url, redis_client):
    alice, bob = await join(server_url), await join(server_url)
    assert (await alice.update(DOC, 1, _text_update("x")))["op"] == "appended"
    await bob.expect("deliver")
    length = await redis_client.xlen("yrelay:{pad}:stream")
    for clock in range(1, 6):
        await announce(alice, AwarenessEntry(11, clock, state(f"alice {clock}")))
        await changes(bob)
    await alice.close()
    await changes(bob)
    assert await redis_client.xlen("yrelay:{pad}:stream") == length == 1


def _text_update(text: str) -> bytes:
    from yrelay.yjs import crdt

    doc = crdt.new_doc(1)
    crdt.insert_text(doc, 0, text)
    return crdt.encode_state(doc)


async def test_redis_going_away_costs_presence_but_not_the_connection(tmp_path):
    """Without Redis, a process still relays between its own connections and
    the document path carries on once Redis is back; so does the pub/sub
    reader, which reconnects by itself."""
    redis = RedisProcess(tmp_path / "redis").start()
    try:
        async with running_server(redis.url, gc_interval=0) as one, running_server(redis.url, gc_interval=0) as two:
            alice, bob, remote = await join(one), await join(one), await join(two)
            redis.kill()
            await announce(alice, AwarenessEntry(11, 1, state("alice")))
            assert await changes(bob, timeout=15) == [AwarenessEntry(11, 1, state("alice"))]
            await settled(alice)
            redis.start()
            answer = await alice.update(DOC, 1, _text_update("after"))
            while answer["op"] == "error":  # the appender may still see the old connection fail once
                answer = await alice.update(DOC, 1, _text_update("after"))
            assert answer["op"] == "appended"
            await remote.expect("deliver", timeout=15)
            for clock in range(2, 200):  # until the readers are subscribed again
                await announce(alice, AwarenessEntry(11, clock, state("alice")))
                try:
                    seen = await changes(remote, timeout=0.2)
                    break
                except TimeoutError:
                    pass
            assert seen == [AwarenessEntry(11, clock, state("alice"))]
    finally:
        redis.stop()


# ------------------------------------------------------------------ limits (issue 16)


async def test_a_presence_flood_is_refused_and_newcomers_get_a_small_greeting(server_url, redis_client):
    """The flood of issue 16: frames of 16 new clientIDs each, as fast as
    the socket takes them. A browser speaks for one clientID: every one of
    these frames is refused, nothing is relayed or stored."""
    mallory, bob = await join(server_url), await join(server_url)
    for frame in range(200):
        await announce(mallory, *(AwarenessEntry(frame * 16 + i + 1, 1, state("x" * 100)) for i in range(16)))
    codes = [(await error_of(mallory))["code"] for _ in range(200)]
    assert set(codes) <= {"awareness_too_many_clients", "rate_limited"} and len(codes) == 200, codes
    assert await redis_client.hlen("yrelay:{pad}:presence") == 0
    await no_changes(bob, 0.3)
    carol = await join(server_url)
    await settled(carol)  # no greeting at all


async def test_presence_rate_per_connection(redis_url):
    async with running_server(redis_url, presence_per_second=5, presence_burst=5) as url:
        alice, bob = await join(url), await join(url)
        for clock in range(1, 21):
            await announce(alice, AwarenessEntry(11, clock, state(f"alice {clock}")))
        await alice.send({"op": "ping"})
        errors = []
        while (frame := await alice.recv())["op"] != "pong":
            errors.append(frame)
        assert all(e["code"] == "rate_limited" and e["retry_after_ms"] > 0 and e["doc"] == DOC for e in errors), errors
        relayed = []
        while True:
            try:
                relayed += await changes(bob, 0.3)
            except TimeoutError:
                break
        assert 5 <= len(relayed) <= 7 and len(relayed) + len(errors) == 20, (relayed, errors)
        await asyncio.sleep(max(e["retry_after_ms"] for e in errors) / 1000)
        await announce(alice, AwarenessEntry(11, 30, state("later")))  # refilled
        assert await changes(bob) == [AwarenessEntry(11, 30, state("later"))]


async def test_clientids_per_connection_and_per_document_are_capped(redis_url, redis_client):
    async with running_server(
        redis_url, max_presence_clients_per_connection=2, max_presence_clients_per_document=5
    ) as url:
        peers = [await join(url) for _ in range(3)]
        watcher = await join(url)
        await announce(peers[0], *(AwarenessEntry(i, 1, state("a")) for i in (1, 2, 3)))
        error = await error_of(peers[0])
        assert error["code"] == "awareness_too_many_clients" and "2 clientIDs" in error["message"], error
        await announce(peers[0], AwarenessEntry(1, 1, state("a")), AwarenessEntry(2, 1, state("a")))
        await announce(peers[1], AwarenessEntry(3, 1, state("b")), AwarenessEntry(4, 1, state("b")))
        assert len(await changes(watcher)) == 2 and len(await changes(watcher)) == 2
        # a removal frees the connection's slot (but the document keeps the clientID reserved)
        await announce(peers[0], AwarenessEntry(2, 2, "null"), AwarenessEntry(5, 1, state("a")))
        assert len(await changes(watcher)) == 2
        await announce(peers[2], AwarenessEntry(6, 1, state("c")))  # the document holds 1..5 already
        error = await error_of(peers[2])
        assert error["code"] == "awareness_too_many_clients" and "500" not in error["message"], error
        await no_changes(watcher, 0.3)
        assert await redis_client.hlen("yrelay:{pad}:presence:owners") == 5
        assert await redis_client.hlen("yrelay:{pad}:presence") == 4  # 2 was removed


async def test_the_greeting_carries_the_newest_states_up_to_its_size_cap(redis_url):
    async with running_server(redis_url, max_presence_greeting_bytes=2_500) as url:
        peers = [await join(url) for _ in range(5)]
        for index, peer in enumerate(peers):
            await announce(peer, AwarenessEntry(index + 1, 1, json.dumps({"name": str(index), "pad": "x" * 1000})))
            await peer.send({"op": "ping"})
            while (await peer.recv())["op"] != "pong":  # stored (the others' states arrive meanwhile)
                pass
            await asyncio.sleep(0.01)  # distinct milliseconds: "newest" is well defined
        carol = await join(url)
        greeting = await changes(carol)
        assert sorted(entry.client_id for entry in greeting) == [4, 5]  # 2 x ~1.1 kB fit, 3 do not
        await settled(carol)


async def test_a_clientid_waits_for_its_user_after_leaving(redis_url):
    """Issue 16: after alice left, mallory (another user) took her clientID
    and alice, back a moment later, was refused it for 30 s. A clientID now
    stays its user's for the presence timeout after leaving: another user is
    refused it, the same user (any session, any process) gets it back."""
    from test_auth import AUTH, token

    async with running_server(redis_url, **AUTH) as one, running_server(redis_url, **AUTH) as two:

        async def joined(url: str, subject: str) -> RawPeer:
            peer = RawPeer(await websockets_connect(url))
            await peer.send({"op": "hello", "token": token([DOC], "read", subject=subject)})
            await peer.expect("welcome")
            await peer.send({"op": "subscribe", "doc": DOC})
            await peer.expect("subscribed")
            peer.clocks = {}  # type: ignore[attr-defined]
            return peer

        alice, bob = await joined(one, "alice"), await joined(two, "bob")
        await announce(alice, AwarenessEntry(11, 1, state("alice")))
        await changes(bob)
        await alice.close()
        assert await changes(bob) == [AwarenessEntry(11, 1, "null")]
        mallory = await joined(two, "mallory")
        await announce(mallory, AwarenessEntry(11, 3, state("not alice")))
        error = await error_of(mallory)
        assert error["code"] == "awareness_not_owner" and "11" in error["message"], error
        await no_changes(bob, 0.3)
        back = await joined(two, "alice")  # a new session of the same user, on the other process
        await announce(back, AwarenessEntry(11, 3, state("alice")))
        assert await changes(bob) == [AwarenessEntry(11, 3, state("alice"))]
        await settled(back)


async def websockets_connect(url: str):
    import websockets

    return await websockets.connect(url, max_size=None)


async def test_a_client_at_the_largest_clock_is_still_removed_when_it_leaves(server_url):
    """Found by the awareness flood fuzz: clock 2^53 - 1 made the removal
    (then clock + 1) unencodable, and the leave raised out of the connection."""
    alice, bob = await join(server_url), await join(server_url)
    await announce(alice, AwarenessEntry(11, MAX_UINT, state("alice")))
    await changes(bob)
    await alice.close()
    frame = await bob.recv()
    assert received(frame) == [AwarenessEntry(11, MAX_UINT, "null")]


async def test_presence_rate_per_subject_across_sockets_and_processes(redis_url):
    from test_auth import AUTH
    from test_limits import hello_as, subscribed

    limits = {**AUTH, "subject_presence_per_second": 1, "subject_presence_burst": 4}
    async with running_server(redis_url, **limits) as one, running_server(redis_url, **limits) as two:
        peers = [await hello_as(url, "alice", "read") for url in (one, two)]
        watcher = await hello_as(one, "bob", "read")
        for peer in (*peers, watcher):
            assert (await subscribed(peer, DOC))["op"] == "subscribed"
            peer.clocks = {}  # type: ignore[attr-defined]
        errors = []
        for index, peer in enumerate(peers):  # 2 sockets x 4 updates, one user
            for clock in range(1, 5):
                await announce(peer, AwarenessEntry(10 + index, clock, state("alice")))
            await peer.send({"op": "ping"})
            while (frame := await peer.recv())["op"] != "pong":
                if frame["op"] == "error":
                    errors.append(frame)
        assert 3 <= len(errors) <= 4, errors  # the burst of 4, and what refilled meanwhile
        assert all(e["code"] == "rate_limited" and "for this user" in e["message"] for e in errors), errors
        await announce(watcher, AwarenessEntry(99, 1, state("bob")))  # another user is not held back
        await watcher.send({"op": "ping"})
        while (frame := await watcher.recv())["op"] != "pong":
            assert frame["op"] == "awareness", frame


async def test_a_greeting_whose_shared_read_began_for_a_closed_connection_still_arrives(redis_url, redis_client):
    """Greetings of one document share one read of its states (issue 30:
    an awareness query was answered from Redis each time). The read is a
    task of its own: a member already listening that shares the read begun
    for a newcomer whose connection then closed still gets the states."""
    from redis.asyncio import Redis

    from yrelay.app.presence import Presence

    presence = Presence(redis_client, Redis.from_url(redis_url), timeout=30, process_id="test")
    frames: list[bytes] = []

    async def keep(update: bytes) -> None:  # what a member's connection is told: the others' awareness update
        frames.append(update)

    speaker = presence.join(DOC, "s-speaker", keep, owner="o-speaker")
    await presence.update(speaker, [AwarenessEntry(7, 1, '{"name":"ada"}')])
    member = presence.join(DOC, "s-member", keep, owner="o-member")
    member.listening, member.listening_since = True, 0.0  # greeted long ago; now it asks again
    newcomer = presence.join(DOC, "s-new", keep, owner="o-new")
    reading, gate = asyncio.Event(), asyncio.Event()
    read = presence._read

    async def slow_read(**kwargs):
        reading.set()
        await gate.wait()
        return await read(**kwargs)

    presence._read = slow_read
    closing = asyncio.create_task(presence.greet(newcomer))
    await asyncio.wait_for(reading.wait(), 5)  # the newcomer's read has begun
    sharing = asyncio.create_task(presence.greet(member))
    await asyncio.sleep(0.05)
    closing.cancel()  # the newcomer's connection closed
    gate.set()
    assert await asyncio.wait_for(sharing, 5) > 0
    assert frames and [e.client_id for e in decode_update(frames[-1])] == [7]
    presence._read = read
    await presence.leave(speaker)
    await presence.listener.aclose()
