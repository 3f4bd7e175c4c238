"""The fault-injection suite in CI: a seeded minute of every fault loses no
acknowledged update and converges; a deliberately broken server is caught.

The figures of each run are printed (``pytest -s``) and left in
``report.md`` under the test's temporary directory; docs/reliability.md has
the long run's.
"""

from __future__ import annotations

import pytest

from yrelay.chaos.nemesis import Fault
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
