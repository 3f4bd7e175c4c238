"""The Python client and presence (Yjs awareness) over a real server and a
real redis-server: other clients' states are kept per document and said as
``awareness`` events, quietly (no ``unexpected frame`` warning); and its
``acked``/``errors`` bookkeeping stays bounded."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

from conftest import eventually
from wsraw import RawPeer
from yrelay.client import client as client_module
from yrelay.client.presence import OUTDATED_AFTER, RemotePresence
from yrelay.yjs import crdt
from yrelay.yjs.awareness import AwarenessEntry, encode_update

DOC = "pad"


def state(name: str) -> str:
    return json.dumps({"user": {"name": name}})


async def announce(peer: RawPeer, *items: AwarenessEntry) -> None:
    update = base64.b64encode(encode_update(items)).decode()
    await peer.send({"op": "awareness", "doc": DOC, "update": update})


async def raw_peer(url: str) -> RawPeer:
    peer = await RawPeer.connect(url)
    await peer.send({"op": "subscribe", "doc": DOC})
    await peer.expect("subscribed")
    return peer


async def test_other_clients_states_are_kept_and_said_without_warnings(server_url, make_client, caplog):
    events: list[dict[str, Any]] = []
    client = await make_client(
        server_url, on_event=lambda name, data: events.append(data) if name == "awareness" else None
    )
    doc = await client.subscribe(DOC)
    alice = await raw_peer(server_url)
    with caplog.at_level(logging.WARNING, logger="yrelay.client.client"):
        await announce(alice, AwarenessEntry(11, 1, state("alice")))
        await eventually(lambda: doc.awareness == {11: {"user": {"name": "alice"}}})
        await announce(alice, AwarenessEntry(11, 2, state("alice, moved")))
        await eventually(lambda: doc.awareness[11] == {"user": {"name": "alice, moved"}})
        await announce(alice, AwarenessEntry(11, 3, "null"))  # she removed her state
        await eventually(lambda: doc.awareness == {})
    assert events == [
        {"doc": DOC, "added": [11], "updated": [], "removed": []},
        {"doc": DOC, "added": [], "updated": [11], "removed": []},
        {"doc": DOC, "added": [], "updated": [], "removed": [11]},
    ]
    assert not [r for r in caplog.records if "unexpected frame" in r.getMessage()]
    await alice.close()


async def test_a_newcomer_client_is_greeted_and_a_closed_peer_is_removed(server_url, make_client):
    alice = await raw_peer(server_url)
    await announce(alice, AwarenessEntry(11, 4, state("alice")))
    await alice.send({"op": "ping"})
    await alice.expect("pong")
    client = await make_client(server_url)
    doc = await client.subscribe(DOC)
    await eventually(lambda: doc.awareness == {11: {"user": {"name": "alice"}}})  # the server's greeting
    await alice.close()  # the server relays a removal at clock 5
    await eventually(lambda: doc.awareness == {})


async def test_known_server_ops_do_not_warn(server_url, make_client, caplog):
    client = await make_client(server_url)
    await client.subscribe(DOC)
    with caplog.at_level(logging.WARNING, logger="yrelay.client.client"):
        for frame in (
            {"op": "synced"},
            {"op": "synced", "doc": "not-subscribed"},
            {"op": "pong"},
            {"op": "unsubscribed", "doc": DOC},
            {"op": "welcome", "session": "x"},
            {"op": "awareness", "doc": DOC, "update": "not base64!"},
        ):
            client._handle(frame)
        client._handle({"op": "no_such_op"})
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "no_such_op" in warned[0]  # an unknown op still warns


def test_stale_clocks_are_ignored_and_outdated_states_expire():
    presence = RemotePresence()
    update = lambda *items: encode_update(items)  # noqa: E731
    assert presence.apply(update(AwarenessEntry(1, 5, state("a"))), now=0)["added"] == [1]
    assert presence.apply(update(AwarenessEntry(1, 4, state("older"))), now=1) == {
        "added": [],
        "updated": [],
        "removed": [],
    }
    assert presence.apply(update(AwarenessEntry(1, 5, "null")), now=2)["removed"] == [1]  # same clock, null: removed
    assert presence.apply(update(AwarenessEntry(2, 1, state("b"))), now=3)["added"] == [2]
    assert presence.expire(now=3 + OUTDATED_AFTER) == [2]
    assert presence.states == {} and presence._clocks == {}  # nothing kept for clients long gone


async def test_acked_and_errors_stay_bounded_with_totals(server_url, make_client, monkeypatch):
    monkeypatch.setattr(client_module, "KEEP_ACKED", 3)
    monkeypatch.setattr(client_module, "KEEP_ERRORS", 2)
    client = await make_client(server_url)
    doc = await client.subscribe(DOC)
    for n in range(10):
        crdt.insert_text(doc.ydoc, n, f"{n}")
        await client.wait_idle()
    assert client.acked_total == 10 and 3 <= len(client.acked) < 6
    assert client.acked[-1].clock == max(a.clock for a in client.acked)  # the newest are kept
    for _ in range(7):
        client._handle({"op": "error", "code": "malformed_frame", "message": "test"})
    assert client.error_codes["malformed_frame"] == 7 and 2 <= len(client.errors) < 4
