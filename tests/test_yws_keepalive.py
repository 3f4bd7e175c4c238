"""A ``/yws`` client alone in a document is never left with a silent
socket: stock y-websocket clients close a socket that heard nothing for
30 s, and renew their awareness every 15 s; y-websocket's own server echoes
each renewal to its sender, which keeps a lone client connected. yrelay
echoes a renewal back only to a socket that was sent nothing for
``yws_echo_after`` seconds (10 by default), so a busy document costs
nothing more (issue 36)."""

from __future__ import annotations

import asyncio
import json

from conftest import eventually, running_server
from yrelay.yjs import yprotocol
from yrelay.yjs.awareness import AwarenessEntry, decode_update, encode_update
from ywspeer import YwsPeer

ECHO_AFTER = 1.5  # long enough that a busy machine handles the first renewal sooner


def renewal(client_id: int, clock: int) -> bytes:
    return yprotocol.awareness(
        encode_update([AwarenessEntry(client_id, clock, json.dumps({"user": {"name": "lone"}}))])
    )


def clocks_heard(peer: YwsPeer, client_id: int) -> list[int]:
    return [entry.clock for update in peer.awareness for entry in decode_update(update) if entry.client_id == client_id]


async def test_a_silent_socket_hears_its_own_renewal_and_a_busy_one_does_not(redis_url):
    async with running_server(redis_url, yws_echo_after=ECHO_AFTER) as url:
        base = url.removesuffix("/ws")
        lone = await YwsPeer.connect(base, "lone-room")
        await lone.ws.send(renewal(7, 1))  # just after the sync answer: the socket is not silent
        await asyncio.sleep(ECHO_AFTER * 2)  # the condition is time itself: silent for longer than yws_echo_after
        await lone.ws.send(renewal(7, 2))
        await eventually(
            lambda: clocks_heard(lone, 7) == [2]
        )  # the silent socket's renewal came back; the first did not
        await lone.edit("x")  # other peers' traffic keeps a busy socket alive: no echo needed
        other = await YwsPeer.connect(base, "lone-room")
        await other.edit("y")
        await eventually(lambda: "y" in str(lone.text))
        await lone.ws.send(renewal(7, 3))  # sent something just now (the edit above): not echoed
        await other.ws.send(renewal(8, 1))
        await eventually(lambda: clocks_heard(lone, 8) == [1])  # relayed after lone's renewal was handled
        assert clocks_heard(lone, 7) == [2]
        await lone.ws.close()
        await other.ws.close()
