"""Today's Python client (as of 2455dc5, before issue 15's protocol
features) still syncs against the new server, beside a new client."""

from __future__ import annotations

import asyncio

from compat.client_v1 import YrelayClient as ClientV1
from conftest import FAST_BACKOFF, eventually, running_server
from yrelay.yjs import crdt


async def test_the_previous_python_client_converges_with_a_new_one(redis_url, make_client):
    async with running_server(redis_url) as url:
        old = ClientV1(url, backoff=FAST_BACKOFF)
        await old.connect()
        try:
            new = await make_client(url)
            odoc, ndoc = await old.subscribe("shared"), await new.subscribe("shared")
            for index in range(20):
                crdt.insert_text(odoc.ydoc, 0, f"old{index} ")
                crdt.insert_text(ndoc.ydoc, len(ndoc.text), f"new{index} ")
                await asyncio.sleep(0.01)
            await old.drop_connection()  # the old client's resend path too
            crdt.insert_text(odoc.ydoc, 0, "offline ")
            await old.wait_idle(10)
            await new.wait_idle(10)
            await eventually(lambda: odoc.text == ndoc.text and "offline" in ndoc.text)
            assert all(f"old{i} " in ndoc.text and f"new{i} " in odoc.text for i in range(20))
            late = await ClientV1(url, backoff=FAST_BACKOFF).connect()  # a fresh old client gets it all
            try:
                ldoc = await late.subscribe("shared")  # it reports synced early, as it always did
                await eventually(lambda: ldoc.text == ndoc.text)
            finally:
                await late.close()
        finally:
            await old.close()
