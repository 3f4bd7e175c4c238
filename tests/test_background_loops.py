"""Every background loop of a server (and a consumer group's heartbeat)
lives through its Redis connections failing with the errors a cluster
failover raises, and works afterwards: revocations are still enforced,
updates and presence still relayed, GC passes still run, leases still
renewed. Nothing is logged at ERROR for it, and no task's exception is left
for nobody to retrieve.

The errors are the real ones, raised by the real code on the process's real
connections (under uvloop, as ``yrelay serve`` runs), not made-up instances:

- ``closed_handler``: the connection's transport is aborted under a command,
  and uvloop refuses the write: ``RuntimeError: unable to perform operation
  on <TCPTransport closed=True ...>; the handler is closed`` (it ended the
  revocation loop for good in ``yrelay chaos --cluster``, issue 39);
- ``race``: the command is written to a connection whose writer another
  task's failure handling took away: redis-py's own ``AttributeError:
  'NoneType' object has no attribute 'writelines'``;
- ``refused``: the plain case, a connection refused.

Reads fail too (a pub/sub listener only reads): the transport is aborted
under the read.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import logging
import time
from collections import defaultdict
from typing import Any

import httpx
import pytest
import redis.exceptions
import uvloop
import websockets
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

from conftest import eventually, running_server
from yrelay.auth import issue_token
from yrelay.consumers import ConsumerGroup
from yrelay.storage.keys import revoked_tokens_key, subject_id, subject_subscriptions_key
from yrelay.yjs import crdt, yprotocol
from yrelay.yjs.awareness import AwarenessEntry, decode_update, encode_update
from ywspeer import YwsPeer

SECRET = "test-secret-0123456789abcdef0123456789"
LEASE = 0.9
SETTINGS = {
    "insecure_no_auth": False,
    "auth_secret": SECRET,
    "revocation_refresh": 0.05,
    "ops_token": "ops",
    "auth_leeway": 0,
    "gc_interval": 0.2,
    "subscription_lease": LEASE,
}
KINDS = ("closed_handler", "race", "refused")
GROUP = "loops"
#: The loops that must each meet every kind of fault (task names).
LOOPS = (
    "yrelay-revocations",
    "yrelay-gc",
    "yrelay-subject-leases",
    "yrelay-fanout",
    "yrelay-presence",
    f"yrelay-consumer-{GROUP}",
)


class TransportFaults:
    """While ``active``, every command written and every reply read on a
    Redis connection of this process fails: each task in turn meets each
    kind of :data:`KINDS`; ``hits[task name]`` are the kinds it met."""

    def __init__(self) -> None:
        self.active = False
        self.hits: dict[str, list[str]] = defaultdict(list)

    def covered(self, loops: tuple[str, ...]) -> bool:
        return all(set(self.hits[name]) >= set(KINDS) for name in loops)

    def _next_kind(self) -> str:
        task = asyncio.current_task()
        name = task.get_name() if task is not None else "?"
        kind = KINDS[len(self.hits[name]) % len(KINDS)]
        self.hits[name].append(kind)
        return kind

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        send, read = AbstractConnection.send_packed_command, AbstractConnection.read_response
        faults = self

        async def failing_send(connection: Any, command: Any, check_health: bool = True) -> None:
            if faults.active and connection.is_connected:
                kind = faults._next_kind()
                if kind == "closed_handler":
                    connection._writer.transport.abort()  # the write below meets the closed handler
                elif kind == "race":
                    connection._writer = None
                    try:
                        await connection._send_packed_command([b"*1\r\n$4\r\nPING\r\n"])  # redis-py's own write
                    finally:
                        await connection.disconnect(nowait=True)
                else:
                    await connection.disconnect(nowait=True)
                    raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1. Connection refused.")
            await send(connection, command, check_health)

        async def failing_read(connection: Any, *args: Any, **kwargs: Any) -> Any:
            if faults.active and connection.is_connected:
                faults._next_kind()
                connection._writer.transport.abort()
            return await read(connection, *args, **kwargs)

        monkeypatch.setattr(AbstractConnection, "send_packed_command", failing_send)
        monkeypatch.setattr(AbstractConnection, "read_response", failing_read)


def credential(token_id: str) -> str:
    return issue_token(SECRET, "alice", ["pad"], "write", 600, token_id=token_id)


def _presence(client_id: int, name: str) -> str:
    entry = AwarenessEntry(client_id, 1, json.dumps({"user": {"name": name}}))
    return base64.b64encode(encode_update([entry])).decode()


class Peer:
    def __init__(self, ws: Any):
        self.ws = ws

    @classmethod
    async def open(cls, url: str, token_id: str) -> Peer:
        peer = cls(await websockets.connect(url))
        await peer.send({"op": "hello", "token": credential(token_id)})
        await peer.until("welcome")
        await peer.send({"op": "subscribe", "doc": "pad"})
        await peer.until("subscribed")
        return peer

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(frame))

    async def until(self, op: str, timeout: float = 30.0) -> dict[str, Any]:
        """The next ``op`` frame (others skipped); generous: the loops back off up to 5 s."""
        async with asyncio.timeout(timeout):
            while (frame := json.loads(await self.ws.recv()))["op"] != op:
                pass
        return frame


def an_update(text: str, client: int) -> str:
    doc = crdt.new_doc(client)
    crdt.insert_text(doc, 0, text)
    return base64.b64encode(crdt.encode_state(doc)).decode()


async def scenario(redis_url: str, faults: TransportFaults) -> None:
    async with running_server(redis_url, **SETTINGS) as url:
        logging.getLogger("uvicorn").propagate = True  # "Exception in ASGI application" reaches caplog
        reader, writer = await Peer.open(url, "tok-reader"), await Peer.open(url, "tok-writer")
        group = ConsumerGroup(Redis.from_url(redis_url), GROUP, lease=LEASE)
        await group.start()
        metrics = httpx.AsyncClient(
            base_url=url.replace("ws://", "http://").removesuffix("/ws"), headers={"Authorization": "Bearer ops"}
        )
        # presence that is removed (relayed, published) when its connection
        # leaves during the faults: /yws and /ws teardown meet the errors too
        leaving = await Peer.open(url, "tok-leaving")
        await leaving.send({"op": "awareness", "doc": "pad", "update": _presence(31, "leaving")})
        yws = await YwsPeer.connect(
            url.removesuffix("/ws"), "pad", subprotocols=["yrelay.yws", f"yrelay.auth.{credential('tok-yws')}"]
        )
        await yws.ws.send(yprotocol.awareness(base64.b64decode(_presence(32, "yws"))))
        await reader.until("awareness")
        try:
            faults.active = True
            await leaving.ws.close()
            await yws.ws.close()
            await eventually(lambda: faults.covered(LOOPS), timeout=60)
            faults.active = False
            recovered_at_ms = time.time() * 1000
            gc_runs = _gc_runs((await metrics.get("/metrics")).text)

            # the fan-out delivers, and the consumer group's member reads, what is appended now
            await writer.send({"op": "update", "doc": "pad", "clock": 1, "update": an_update("after", 11)})
            assert (await writer.until("appended"))["clock"] == 1
            assert (await reader.until("deliver"))["doc"] == "pad"
            async with asyncio.timeout(30):
                async for batch in group.batches():
                    if batch.doc == "pad" and batch.entries:
                        break
            # presence is relayed
            await writer.send({"op": "awareness", "doc": "pad", "update": _presence(21, "w")})
            while 21 not in [
                entry.client_id
                for entry in decode_update(base64.b64decode((await reader.until("awareness"))["update"]))
            ]:
                pass
            # GC passes run again, and this process's subscription leases are renewed
            await until(lambda: _gc_runs_after(metrics, gc_runs))
            async with Redis.from_url(redis_url) as redis:
                await until(lambda: _renewed_since(redis, recovered_at_ms))
                # a token revoked in Redis (by another process) is still enforced here
                await redis.zadd(revoked_tokens_key(), {"tok-reader": time.time() + 600})
            error = await reader.until("error")
            assert (error["code"], error["message"]) == ("unauthorized", "the token was revoked")
        finally:
            faults.active = False
            await metrics.aclose()
            await group.leave()
            await group.redis.aclose()
            logging.getLogger("uvicorn").propagate = False


async def until(check: Any, timeout: float = 30.0) -> None:
    """Poll the async ``check`` until it is true (the loops back off up to 5 s after the faults)."""
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)


async def _gc_runs_after(metrics: httpx.AsyncClient, before: float) -> bool:
    return _gc_runs((await metrics.get("/metrics")).text) > before


def _gc_runs(text: str) -> float:
    [line] = [line for line in text.splitlines() if line.startswith('yrelay_gc_runs_total{trigger="loop"}')]
    return float(line.rsplit(" ", 1)[1])


async def _renewed_since(redis: Redis, since_ms: float) -> bool:
    """Every lease of the subject's count expires a whole lease after ``since_ms``: written since."""
    leases = await redis.hgetall(subject_subscriptions_key(subject_id("sub:alice")))
    return bool(leases) and all(int(value.split(b"|")[1]) >= since_ms + LEASE * 1000 for value in leases.values())


def test_every_background_loop_lives_through_transport_errors_and_works_after(redis_url, monkeypatch, caplog):
    faults = TransportFaults()
    faults.install(monkeypatch)
    caplog.set_level(logging.WARNING)
    uvloop.run(scenario(redis_url, faults))
    gc.collect()  # a task whose exception nobody retrieved says so when it is collected
    assert faults.covered(LOOPS), dict(faults.hits)
    assert not [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert not [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]
