"""What the type checker found in the server (issue 33), pinned where a
run can show it: a ``/yws`` close started from the fan-out's synchronous
calls runs on a task kept until done (the subscription's pump) whose
failure is logged (a bare ``create_task`` is held weakly by asyncio, and
its error surfaced, if ever, as "Task exception was never retrieved" when
collected); ``welcome``
announces the rate limits as the numbers they are (fractions included).
"""

from __future__ import annotations

import json
import logging

import pytest
import websockets

from conftest import eventually, running_server
from yrelay.app.context import ServerContext
from yrelay.app.core.subscription import SubscriptionState
from yrelay.app.wire.yws import CLOSE_DOCUMENT_FAILED, CLOSE_REWOUND
from yrelay.config import Settings
from yrelay.storage.offsets import StreamId
from ywspeer import RecordedSocket, untracked_subscription


async def test_a_feed_close_started_by_the_fanout_is_kept_and_its_failure_logged(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = await ServerContext.open(Settings.from_env(insecure_no_auth=True), redis_url)
    closes: list[int] = []

    class RefusingSocket(RecordedSocket):
        async def close(self, code: int, reason: str) -> None:
            closes.append(code)
            raise RuntimeError(f"the socket refused close {code}")

    def logged() -> list[logging.LogRecord]:  # by the pump's own boundary, not asyncio's collector
        return [
            r for r in caplog.records if r.name == "yrelay.app.core.subscription" and "refused close" in r.getMessage()
        ]

    try:
        with caplog.at_level(logging.WARNING, logger="yrelay.app.core.subscription"):
            feed, socket = untracked_subscription(ctx, "gates-close", RefusingSocket(ctx))
            await eventually(lambda: feed.state is SubscriptionState.RESYNC_REQUIRED)
            feed.live_from(StreamId(0, 0))
            feed.stream_rewound()  # the fan-out's synchronous call: the close runs on the subscription's task
            await eventually(lambda: len(logged()) == 1)
            feed.document_failed("unreadable")  # a new task: it closes too
            await eventually(lambda: len(logged()) == 2)
        assert closes == [CLOSE_REWOUND, CLOSE_DOCUMENT_FAILED] and not socket.sent
        await feed.close()
    finally:
        await ctx.close()


async def test_welcome_announces_fractional_rates_as_configured(redis_url: str) -> None:
    async with running_server(redis_url, updates_per_second=0.5, presence_per_second=2.5) as url:
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"op": "hello"}))
            limits = json.loads(await ws.recv())["limits"]
    assert (limits["updates_per_second"], limits["presence_per_second"]) == (0.5, 2.5)
    assert isinstance(limits["update_burst"], int) and isinstance(limits["max_update_bytes"], int)
