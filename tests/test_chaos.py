"""The fault-injection suite in CI: a seeded minute of every fault loses no
acknowledged update and converges; a deliberately broken server is caught.

The figures of each run are printed (``pytest -s``) and left in
``report.md`` under the test's temporary directory; docs/reliability.md has
the long run's.
"""

from __future__ import annotations

import asyncio

import pytest

from yrelay import crdt
from yrelay.chaos.checker import not_stored, update_key
from yrelay.chaos.nemesis import NETWORK, Fault, parse_faults, schedule
from yrelay.chaos.proxy import FaultProxy
from yrelay.redis_server import free_port
from yrelay.chaos.run import ChaosConfig, run_chaos
from yrelay.testing.checker import DeliveryViolation


@pytest.mark.timeout(420)
async def test_a_minute_of_every_fault_loses_no_acked_update(tmp_path):
    config = ChaosConfig(seed=8, duration=60, clients=5, docs=3, servers=3, mean_gap=3.5)
    report = await run_chaos(config, tmp_path)
    print(report.to_markdown())
    report.verify()
    assert report.delivery.lost == 0 and report.delivery.acked_updates > 500
    assert report.delivery.recovered == report.delivery.lost_from_redis
    assert set(report.faults_by_kind()) == {fault.value for fault in Fault}
    assert not [record.detail for record in report.injected if record.detail.startswith(("failed", "skipped"))]
    # appendfsync always: a Redis restarted from its AOF has every acked update.
    assert {record.detail for record in report.injected if record.action.fault is Fault.REDIS_KILL} == {
        "acked updates missing from the restarted Redis: 0"}


@pytest.mark.timeout(300)
async def test_the_checker_catches_a_server_that_acks_before_appending(tmp_path):
    """The same harness against yrelay.testing.broken_server (``appended`` is
    sent before the append): updates acked while Redis is down are stored
    nowhere, and the checker must say so."""
    config = ChaosConfig(seed=3, duration=20, clients=3, docs=1, servers=1, faults=(Fault.REDIS_KILL,), replica=False,
                         mean_gap=4, edit_interval=0.05, quiet=10, settle_timeout=60,
                         server_module="yrelay.testing.broken_server")
    report = await run_chaos(config, tmp_path)
    print(report.to_markdown())
    with pytest.raises(DeliveryViolation, match="acked updates missing"):
        report.verify()
    assert report.delivery.lost > 0


def test_stored_means_in_redis_even_while_waiting_for_a_dependency():
    doc = crdt.new_doc(9)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    for token in ("<a>", "<b>", "<c>"):
        crdt.insert_text(doc, 0, token)
    acked = {update_key("d", update): update for update in updates}
    keys = list(acked)
    assert not_stored([updates[2]], acked) == {keys[0], keys[1]}  # the third alone is pending, yet stored
    assert not_stored(updates, acked) == set()


def test_the_schedule_is_a_function_of_its_seed_and_has_every_kind():
    faults = parse_faults("all")
    one, again = schedule(5, 60, faults, 3.5), schedule(5, 60, faults, 3.5)
    assert one == again and one != schedule(6, 60, faults, 3.5)
    assert {action.fault for action in one} == set(Fault)
    assert all(2 <= action.at <= 54 for action in one)
    assert parse_faults("network,gc,net-drop") == [*NETWORK, Fault.GC]


async def echo_server() -> tuple[asyncio.base_events.Server, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_the_proxy_forwards_in_order_with_latency_and_resets_or_goes_silent():
    server, port = await echo_server()
    proxy = await FaultProxy(lambda: [free_port(), port]).start()  # the first upstream refuses: the next is tried
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        proxy.degrade(latency=0.05)
        for index in range(20):
            writer.write(f"{index},".encode())
        expected = "".join(f"{index}," for index in range(20)).encode()
        assert await asyncio.wait_for(reader.readexactly(len(expected)), 5) == expected
        proxy.clear()

        proxy.half_open(0.3)  # the client's side stays open and silent, then is reset
        writer.write(b"lost")
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(10), 5)
        assert proxy.stats.half_opens == 1

        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"x")
        assert await asyncio.wait_for(reader.readexactly(1), 5) == b"x"
        proxy.reset()
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(10), 5)
    finally:
        await proxy.stop()
        server.close()
