"""What the type checker found in the server (issue 33), pinned where a
run can show it: a ``/yws`` close started from the fan-out's synchronous
calls is a task kept until done whose failure is logged (a bare
``create_task`` is held weakly by asyncio, and its error surfaced, if ever,
as "Task exception was never retrieved" when collected); ``welcome``
announces the rate limits as the numbers they are (fractions included).
"""

from __future__ import annotations

import json
import logging

import pytest
import websockets

from conftest import eventually, running_server
from yrelay.app.context import ServerContext
from yrelay.app.yws_feed import CLOSE_DOCUMENT_FAILED, CLOSE_REWOUND, YwsFeed
from yrelay.config import Settings


async def test_a_feed_close_started_by_the_fanout_is_kept_and_its_failure_logged(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = await ServerContext.open(Settings.from_env(insecure_no_auth=True), redis_url)
    closes: list[int] = []

    async def send(data: bytes) -> None:
        raise AssertionError("nothing is sent before an answer")

    async def close(code: int, reason: str) -> None:
        closes.append(code)
        raise RuntimeError(f"the socket refused close {code}")

    def logged() -> list[logging.LogRecord]:  # by the spawned task's own handler, not asyncio's collector
        return [r for r in caplog.records if r.name == "yrelay.tasks" and "yrelay-yws-close" in r.getMessage()]

    try:
        feed = YwsFeed(ctx, "gates-close", "reader", send, close)
        with caplog.at_level(logging.ERROR, logger="yrelay.tasks"):
            feed.stream_rewound()  # the fan-out's synchronous call: the close runs as a task
            feed.document_failed("unreadable")
            await eventually(lambda: len(logged()) == 2)
        assert closes == [CLOSE_REWOUND, CLOSE_DOCUMENT_FAILED]
        assert all(r.exc_info and isinstance(r.exc_info[1], RuntimeError) for r in logged()), logged()
    finally:
        await ctx.close()


async def test_welcome_announces_fractional_rates_as_configured(redis_url: str) -> None:
    async with running_server(redis_url, updates_per_second=0.5, presence_per_second=2.5) as url:
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"op": "hello"}))
            limits = json.loads(await ws.recv())["limits"]
    assert (limits["updates_per_second"], limits["presence_per_second"]) == (0.5, 2.5)
    assert isinstance(limits["update_burst"], int) and isinstance(limits["max_update_bytes"], int)
