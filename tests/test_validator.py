"""Updates are checked by y-py in validator processes: an update that
aborts y-py's process or hangs it costs a worker restart, never the server."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from test_validation import good_update
from wsraw import RawPeer

from yrelay import crdt
from yrelay.app.validator import Validator

#: Passes yrelay's layout decoder; y-py 0.6.2 panics on it with a message
#: pyo3 cannot convert, and the Rust runtime aborts the whole process.
ABORTS_YPY = bytes.fromhex("0101f430c4014501460af4313220c3bcf09f988000")


def test_the_abort_is_real_and_the_layout_check_does_not_catch_it():
    crdt.check_layout(ABORTS_YPY)  # structurally fine
    code = "import sys, y_py; y_py.apply_update(y_py.YDoc(), bytes.fromhex(sys.argv[1]))"
    result = subprocess.run([sys.executable, "-c", code, ABORTS_YPY.hex()], capture_output=True, timeout=60)
    assert result.returncode not in (0, 1), result.returncode  # killed by SIGABRT, not an exception
    assert b"fatal runtime error" in result.stderr


async def test_a_crashing_update_is_rejected_and_its_batch_mates_pass():
    validator = Validator(workers=1, timeout=5.0)
    await validator.start()
    try:
        good = [good_update(f"g{i}") for i in range(5)]
        results = await asyncio.gather(*(validator.validate(update) for update in [*good[:2], ABORTS_YPY, *good[2:]]),
                                       return_exceptions=True)
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
        results = await asyncio.gather(validator.validate(good_update("a")), validator.validate(hang),
                                       validator.validate(good_update("b")), return_exceptions=True)
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], crdt.InvalidUpdate) and "0.5s" in str(results[1])
        await validator.validate(good_update("c"))
    finally:
        await validator.stop()


async def test_the_server_survives_an_update_that_aborts_y_py(server_url, redis_client):
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "v"})
    await peer.expect("subscribed")
    answer = await peer.update("v", 1, ABORTS_YPY)
    assert answer["op"] == "error" and answer["code"] == "invalid_update" and answer["clock"] == 1, answer
    assert await redis_client.xlen("yrelay:{v}:stream") == 0
    assert (await peer.update("v", 2, good_update()))["op"] == "appended"
    await peer.close()
