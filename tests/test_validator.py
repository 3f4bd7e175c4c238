"""Updates are checked by pycrdt (and y-py, with ``validate_with_ypy``) in
validator processes: an update that aborts an engine's process or hangs it
costs a worker restart, never the server."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from conftest import running_server
from engines import needs_ypy
from test_validation import good_update
from wsraw import RawPeer
from yrelay.config import Settings
from yrelay.yjs import crdt
from yrelay.yjs.validator import Validator

#: Passes yrelay's layout decoder; y-py 0.6.2 panics on it with a message
#: pyo3 cannot convert, and the Rust runtime aborts the whole process.
ABORTS_YPY = bytes.fromhex("0101f430c4014501460af4313220c3bcf09f988000")
#: pycrdt applies it; y-py 0.6.2 aborts its process on it (found by the
#: fuzz of issue 32): what a server without y-py's check stores, and what
#: a y-py client would then die of.
ONLY_PYCRDT_READS = bytes.fromhex("0181000000c90001000081006b76800000")


@needs_ypy
@pytest.mark.parametrize("update", [ABORTS_YPY, ONLY_PYCRDT_READS], ids=["pycrdt-refuses", "pycrdt-reads"])
def test_the_abort_is_real_and_the_layout_check_does_not_catch_it(update):
    crdt.check_layout(update)  # structurally fine
    code = "import sys, y_py; y_py.apply_update(y_py.YDoc(), bytes.fromhex(sys.argv[1]))"
    result = subprocess.run([sys.executable, "-c", code, update.hex()], capture_output=True, timeout=60)
    assert result.returncode not in (0, 1), result.returncode  # killed by SIGABRT, not an exception
    assert b"fatal runtime error" in result.stderr or b"panicked" in result.stderr, result.stderr[-500:]


def test_pycrdt_reads_what_aborts_y_py():
    crdt.validate_update(ONLY_PYCRDT_READS)


async def test_pycrdt_alone_refuses_the_update_that_aborts_y_py_without_a_restart():
    validator = Validator(workers=1, timeout=5.0)
    await validator.start()
    try:
        with pytest.raises(crdt.InvalidUpdate, match="not a Yjs update"):
            await validator.validate(ABORTS_YPY)
        await validator.validate(good_update("after"))
        assert validator.restarts == 0 and validator.timeouts == 0
    finally:
        await validator.stop()


@needs_ypy
async def test_a_crashing_update_is_rejected_and_its_batch_mates_pass():
    validator = Validator(workers=1, timeout=5.0, with_ypy=True)
    await validator.start()
    try:
        good = [good_update(f"g{i}") for i in range(5)]
        results = await asyncio.gather(
            *(validator.validate(update) for update in [*good[:2], ONLY_PYCRDT_READS, *good[2:]]),
            return_exceptions=True,
        )
        assert [type(r).__name__ for r in results] == ["NoneType"] * 2 + ["InvalidUpdate"] + ["NoneType"] * 3
        assert validator.restarts >= 1 and validator.timeouts == 1
        with pytest.raises(crdt.InvalidUpdate):
            await validator.validate(b"\xff\xfe\x01")  # garbage: refused by the in-loop layout check
        await validator.validate(good_update("after"))  # the restarted worker serves
    finally:
        await validator.stop()


async def test_a_hanging_update_is_cut_off_at_the_deadline():
    validator = Validator(workers=2, timeout=0.5, module="yrelay_tools.testing.hanging_validator")
    await validator.start()
    try:
        hang = good_update("HANG")
        results = await asyncio.gather(
            validator.validate(good_update("a")),
            validator.validate(hang),
            validator.validate(good_update("b")),
            return_exceptions=True,
        )
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], crdt.InvalidUpdate) and "0.5s" in str(results[1])
        await validator.validate(good_update("c"))
    finally:
        await validator.stop()


@pytest.mark.parametrize("with_ypy", [False, pytest.param(True, marks=needs_ypy)], ids=["pycrdt", "with-y-py"])
async def test_the_server_survives_an_update_that_aborts_y_py(redis_url, redis_client, with_ypy):
    async with running_server(redis_url, validate_with_ypy=with_ypy) as server_url:
        await _refuses_the_abort(server_url, redis_client)


@needs_ypy
async def test_with_y_pys_check_on_the_servers_workers_run_it(redis_url):
    """The setting reaches the validator's and the engine's workers (the
    update pycrdt reads and y-py aborts on is refused by the validator with
    it: test_a_crashing_update_is_rejected_and_its_batch_mates_pass)."""
    import psutil

    def workers() -> list[list[str]]:
        found = []
        for child in psutil.Process().children(recursive=True):
            try:
                command = child.cmdline()
            except (psutil.ZombieProcess, psutil.NoSuchProcess, psutil.AccessDenied):
                continue  # another test's process on its way out (a zombie redis-server, seen in CI)
            if "yrelay.yjs.validation" in command or "yrelay.yjs.engine" in command:
                found.append(command[1:])
        return found

    async with running_server(redis_url, validate_with_ypy=True):
        started = workers()
        assert {tuple(args) for args in started} == {
            ("-m", "yrelay.yjs.validation", "--ypy"),
            ("-m", "yrelay.yjs.engine", "--ypy"),
        }, started
    async with running_server(redis_url):
        assert all("--ypy" not in args for args in workers())


def test_validate_with_ypy_without_y_py_refuses_to_start(monkeypatch):
    monkeypatch.setattr("yrelay.config._ypy_installed", lambda: False)
    with pytest.raises(ValueError, match=r"validate_with_ypy needs y-py, the ypy extra: pip install 'yrelay\[ypy\]'"):
        Settings(validate_with_ypy=True)
    assert not Settings().validate_with_ypy  # off by default


async def _refuses_the_abort(server_url: str, redis_client) -> None:
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "v"})
    await peer.expect("subscribed")
    answer = await peer.update("v", 1, ABORTS_YPY)
    assert answer["op"] == "error" and answer["code"] == "invalid_update" and answer["clock"] == 1, answer
    assert await redis_client.xlen("yrelay:{v}:stream") == 0
    assert (await peer.update("v", 2, good_update()))["op"] == "appended"
    await peer.close()


@needs_ypy
def test_with_y_pys_check_a_client_id_past_32_bits_is_refused():
    """y-py reads such an id as another client: its peers never converge."""
    import pycrdt

    doc = pycrdt.Doc(client_id=2**40 + 5)
    doc.get("text", type=pycrdt.Text).insert(0, "x")
    crdt.validate_update(doc.get_update())
    with pytest.raises(crdt.InvalidUpdate, match="client id past 2\\*\\*32 - 1"):
        crdt.validate_update(doc.get_update(), with_ypy=True)
