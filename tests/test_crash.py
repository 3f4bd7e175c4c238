"""Several server processes on one Redis; SIGKILL of a server and of Redis."""

import asyncio
import random

from conftest import FAST_BACKOFF, eventually, running_server
from yrelay.client import YrelayClient
from yrelay.storage.embedded import RedisProcess
from yrelay.storage.reads import DocumentStore
from yrelay.yjs import crdt
from yrelay_tools.testing.checker import check_delivery
from yrelay_tools.testing.processes import ServerProcess


async def edit(client_doc, rounds: int, tag: str, pause: float = 0.005) -> None:
    for i in range(rounds):
        position = random.randint(0, len(crdt.text_of(client_doc.ydoc)))
        crdt.insert_text(client_doc.ydoc, position, f"<{tag}{i}>")
        await asyncio.sleep(pause)


async def server_state(redis_client, doc: str):
    ydoc, _ = await DocumentStore(redis_client).load_document(doc)
    return ydoc


async def test_two_processes_converge_and_survive_sigkill(redis_url, redis_client, tmp_path):
    one = ServerProcess(redis_url, tmp_path).start()
    two = ServerProcess(redis_url, tmp_path).start()
    clients = [YrelayClient([one.ws_url, two.ws_url], backoff=FAST_BACKOFF) for _ in range(2)]
    clients += [YrelayClient([two.ws_url, one.ws_url], backoff=FAST_BACKOFF) for _ in range(2)]
    try:
        for client in clients:
            await client.connect()
        docs = [await client.subscribe("shared") for client in clients]
        editing = [asyncio.create_task(edit(doc, 60, f"c{i}-")) for i, doc in enumerate(docs)]
        await asyncio.sleep(0.15)
        one.kill()  # mid-edit: its clients move to process two
        await asyncio.gather(*editing)
        for client in clients:
            await client.wait_idle(timeout=30)
        await eventually(lambda: len({d.text for d in docs}) == 1, timeout=20)
        acked = [u.update for c in clients for u in c.acked]
        replicas = {f"client-{i}": d.ydoc for i, d in enumerate(docs)}
        replicas["server"] = await server_state(redis_client, "shared")
        report = check_delivery(replicas, acked)
        # Every edit exactly once (the acked list may hold a resent update twice).
        assert len(report.content) == sum(len(f"<c{i}-{k}>") for i in range(4) for k in range(60))
    finally:
        for client in clients:
            await client.close()
        one.stop()
        two.stop()


async def test_redis_sigkill_and_aof_restart_loses_no_acked_update(tmp_path):
    redis = RedisProcess(tmp_path / "redis").start()
    try:
        async with running_server(redis.url) as url:
            clients = [YrelayClient(url, backoff=FAST_BACKOFF) for _ in range(3)]
            for client in clients:
                await client.connect()
            docs = [await client.subscribe("durable") for client in clients]
            editing = [asyncio.create_task(edit(doc, 50, f"r{i}-", 0.01)) for i, doc in enumerate(docs)]
            await asyncio.sleep(0.2)
            acked_before_kill = [u.update for c in clients for u in c.acked]
            redis.kill()
            await asyncio.sleep(0.5)
            redis.start()  # same port, same AOF
            await asyncio.gather(*editing)
            for client in clients:
                await client.wait_idle(timeout=60)
            await eventually(lambda: len({d.text for d in docs}) == 1, timeout=30)
            from redis.asyncio import Redis

            check_client = Redis.from_url(redis.url)
            replicas = {f"client-{i}": d.ydoc for i, d in enumerate(docs)}
            replicas["server"] = await server_state(check_client, "durable")
            await check_client.aclose()
            acked = [u.update for c in clients for u in c.acked]
            assert len(acked_before_kill) > 0
            report = check_delivery(replicas, acked)
            assert len(report.content) == sum(len(f"<r{i}-{k}>") for i in range(3) for k in range(50))
            for client in clients:
                await client.close()
    finally:
        redis.stop()


async def test_checker_catches_a_missing_update():
    """The checker must fail when an acked update is absent somewhere."""
    import pytest

    from yrelay_tools.testing.checker import DeliveryViolation

    full, partial = crdt.new_doc(1), crdt.new_doc(2)
    updates: list[bytes] = []
    crdt.observe_updates(full, updates.append)
    crdt.insert_text(full, 0, "abc")
    crdt.insert_text(full, 3, "def")
    crdt.apply_update(partial, updates[0])
    with pytest.raises(DeliveryViolation, match="missing"):
        check_delivery({"full": full, "partial": partial}, updates)
    crdt.apply_update(partial, updates[1])
    assert check_delivery({"full": full, "partial": partial}, updates).content == "abcdef"


async def test_a_subscribe_while_redis_is_down_completes_when_it_is_back(tmp_path):
    from wsraw import RawPeer

    redis = RedisProcess(tmp_path / "redis").start()
    try:
        async with running_server(redis.url, gc_interval=0) as url:
            peer = await RawPeer.connect(url)
            redis.kill()
            await peer.send({"op": "subscribe", "doc": "later"})
            error = await peer.expect("error", timeout=15)
            assert error["code"] == "unavailable" and error["doc"] == "later"
            redis.start()
            while (frame := await peer.recv(timeout=20))["op"] == "error":
                assert frame["code"] == "unavailable"  # the retries before Redis came back
            assert frame["op"] == "subscribed" and frame["doc"] == "later"
    finally:
        redis.stop()


async def test_yws_edits_survive_sigkill_of_server_and_redis_and_offline_edits_merge(tmp_path):
    """A y-websocket peer's edit that another peer saw (so it was stored:
    others see only the stream) survives kill -9 of the server and of Redis
    (AOF always); edits made while both were down arrive with the peer's
    reconnect sync (issue 19)."""
    from ywspeer import YwsPeer

    redis = RedisProcess(tmp_path / "redis").start()
    server = ServerProcess(redis.url, tmp_path).start()
    base = f"ws://127.0.0.1:{server.port}"
    try:
        writer = await YwsPeer.connect(base, "yws-durable")
        reader = await YwsPeer.connect(base, "yws-durable")
        for word in ("one ", "two "):
            await writer.edit(word)
        await eventually(lambda: str(reader.text) == "one two ")
        server.kill()
        redis.kill()
        await writer.edit("offline ")  # the socket is gone: y-websocket keeps it in the document
        await writer.close()
        await reader.close()
        redis.start()  # same port, same AOF
        server = ServerProcess(redis.url, tmp_path, port=server.port).start()
        fresh = await YwsPeer.connect(base, "yws-durable")
        assert str(fresh.text) == "one two "  # stored before the kill: kept
        again = await YwsPeer.connect(base, "yws-durable", ydoc=writer.doc)  # the reconnect sync sends it
        await eventually(lambda: str(fresh.text) == "one two offline ")
        await fresh.edit("back")
        await eventually(lambda: str(again.text) == "one two offline back")
        for peer in (fresh, again):
            await peer.close()
    finally:
        server.stop()
        redis.stop()
