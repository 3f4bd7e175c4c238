"""The Python client resends an unanswered update only when its connection
makes no progress (issue 30's backpressure): a server over its rates reads
the socket more slowly and answers in order, so while answers keep coming
the update's own answer is on its way, and a resend would only add load.
Refusals keep their schedule, and a connection that answers nothing still
resends and, past ``max_attempts``, reconnects."""

from __future__ import annotations

import pytest

from conftest import running_server
from yrelay.client import Backoff
from yrelay.client.sendbuffer import PendingUpdate, SendBuffer
from yrelay.yjs import crdt

EDITS = 300


@pytest.mark.timeout(120)
async def test_a_client_slowed_down_by_the_server_does_not_resend(redis_url, make_client):
    # 50 updates per second after a burst of 10: the 300 edits take ~6 s to be
    # read, far longer than the first resend delays (0.125 s to 0.25 s).
    async with running_server(redis_url, updates_per_second=50, update_burst=10) as url:
        client = await make_client(url, backoff=Backoff())
        doc = await client.subscribe("paced")
        for i in range(EDITS):
            crdt.insert_text(doc.ydoc, i, "x")
        await client.wait_idle(timeout=90)
        sends, resends = client.buffer.sends, client.buffer.resends
        assert dict(client.error_codes) == {}, client.errors[:5]
        assert client.acked_total == EDITS
        # Before the change: hundreds of resends (each update's answer waited
        # behind the paced ones, longer than its backoff delay).
        assert resends <= EDITS * 0.05, f"{resends} resends in {sends} sends of {EDITS} updates"


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def sent(*docs: str) -> tuple[FakeTime, SendBuffer, list[PendingUpdate]]:
    """A buffer on a fake clock (resends after 1 s, 2 s, 4 s; 3 attempts)
    with one update of each of ``docs``, all sent."""
    time = FakeTime()
    buffer = SendBuffer(Backoff(base=1.0, factor=2.0, max_delay=10.0, jitter=0.0, max_attempts=3), timer=time)
    items = [buffer.add(doc, doc.encode()) for doc in docs]
    send_due(buffer)
    return time, buffer, items


def send_due(buffer: SendBuffer) -> None:
    for item in buffer.due():
        buffer.mark_sent(item)


def clocks(buffer: SendBuffer) -> list[int]:
    return [item.clock for item in buffer.due()]


def test_an_update_is_resent_only_after_its_delay_without_an_answer() -> None:
    time, buffer, (first, second) = sent("d", "e")
    time.now += 0.9
    buffer.answered()  # an answer (of an earlier update, say): the connection is read
    time.now += 0.9  # past both delays (1 s), but 0.9 s after an answer
    assert clocks(buffer) == []
    time.now += 0.1  # 1 s of silence
    assert clocks(buffer) == [first.clock, second.clock]
    buffer.mark_sent(first)  # attempt 2: 2 s
    time.now += 1.5
    buffer.answered()
    assert buffer.pop(second.clock) is second
    time.now += 1.5  # past its delay, but the connection answered 1.5 s ago
    assert clocks(buffer) == []
    time.now += 0.5
    assert clocks(buffer) == [first.clock]


def test_refusals_keep_their_schedule_and_a_silent_connection_exhausts() -> None:
    time, buffer, (refused, deferred) = sent("a", "b")
    buffer.refused(refused.clock)  # unavailable: resent after its delay, answers or not
    buffer.defer(deferred.clock, 3.0)  # rate_limited from an older server: after retry_after_ms
    time.now += 1.0
    buffer.answered()
    assert clocks(buffer) == [refused.clock]
    buffer.mark_sent(refused)
    time.now += 2.0
    buffer.answered()
    assert clocks(buffer) == [deferred.clock], "the deferred one is due whatever the answers"
    buffer.mark_sent(deferred)
    # Nothing answered any more: resent after each delay until the attempts are used up.
    for _ in range(3):
        time.now += 10.0
        assert clocks(buffer) == [refused.clock, deferred.clock]
        send_due(buffer)
    assert buffer.exhausted()


def test_a_new_connection_starts_without_answers() -> None:
    time, buffer, (item,) = sent("d")
    time.now += 0.5
    buffer.answered()
    buffer.reset_attempts()  # reconnected: sent again at once ...
    assert clocks(buffer) == [item.clock]
    buffer.mark_sent(item)
    time.now += 1.0  # ... and resent after its delay: no answer came on this connection
    assert clocks(buffer) == [item.clock]
