"""Webhook dead letters against a real redis-server, a real receiver and a
real server's /ops and /metrics: a document that keeps failing is parked
(not sent, its position kept) while the others flow; it stays parked when
it moves to another member; a retry delivers it from its last ack."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from conftest import eventually, serving
from consumerutil import LEASE
from test_consumers import write
from test_metrics import AUTH, Scrape, scrape_until, served
from yrelay.backoff import Backoff
from yrelay.consumers import ConsumerGroup
from yrelay.consumers.dead_letters import DeadLetters
from yrelay.consumers.webhook import Webhook
from yrelay.storage.embedded import free_port
from yrelay.storage.offsets import StreamId

SECRET = "whsec-test"
FAST = Backoff(base=0.02, max_delay=0.1)


class Receiver:
    """Answers ``status[doc]`` (default 204) and records every request."""

    def __init__(self) -> None:
        self.status: dict[str, int] = {}
        self.seen: dict[str, list[tuple[list[str], int]]] = defaultdict(list)
        self.app = Starlette(routes=[Route("/hook", self.hook, methods=["POST"])])

    async def hook(self, request: Request) -> Response:
        data = json.loads(await request.body())
        status = self.status.get(data["doc"], 204)
        self.seen[data["doc"]].append((data["ids"], status))
        return Response(status_code=status)

    def accepted(self, doc: str) -> list[str]:
        return [i for ids, status in self.seen[doc] if status < 300 for i in ids]


def sample(scrape: Scrape, name: str, group: str) -> float:
    return scrape.samples.get((name, frozenset({"group": group}.items())), -1)


async def _run(webhook: Webhook) -> asyncio.Task:
    return asyncio.create_task(webhook.run())


async def _stop(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_failing_document_is_parked_the_others_flow_and_a_retry_resumes_it(redis_url, redis_client, store):
    written = await write(store, ["poison", "ok-1", "ok-2"], 2)
    receiver = Receiver()
    receiver.status["poison"] = 500
    port, name = free_port(), "hooks-dead"
    async with serving(receiver.app, port), served(redis_url) as (_, http):
        async with ConsumerGroup(redis_client, name, member="w1", lease=LEASE) as group:
            webhook = Webhook(group, f"http://127.0.0.1:{port}/hook", SECRET, backoff=FAST, max_attempts=3)
            task = await _run(webhook)
            await eventually(lambda: webhook.stats.dead_letters == 1 and webhook.stats.delivered == 2, timeout=15)
            assert [status for _, status in receiver.seen["poison"]] == [500] * 3
            listed = (await http.get(f"/ops/groups/{name}/dead-letters", headers=AUTH)).json()["dead_letters"]
            assert [(d["doc"], d["attempts"], d["error"], d["status"], d["member"]) for d in listed] == [
                ("poison", 3, "HTTP 500", 500, "w1")
            ]
            assert listed[0]["delivery"] == f"poison:{written['poison'][0]}:{written['poison'][-1]}"

            # The others keep flowing; nothing of the parked one is sent, nothing past its failure acked.
            more = await write(store, ["poison", "ok-1"], 1, word="more")
            await eventually(lambda: receiver.accepted("ok-1") == written["ok-1"] + more["ok-1"], timeout=10)
            await asyncio.sleep(0.3)  # a read of both documents' new entries came and went
            assert len(receiver.seen["poison"]) == 3
            assert (await group.progress.offsets(["poison"]))["poison"] < StreamId.parse(written["poison"][0])

            result = await scrape_until(http, lambda s: sample(s, "yrelay_webhook_delivered_total", name) == 3)
            assert sample(result, "yrelay_webhook_failed_total", name) == 3
            assert sample(result, "yrelay_webhook_retries_total", name) == 2
            assert sample(result, "yrelay_webhook_dead_letters_total", name) == 1
            assert sample(result, "yrelay_webhook_parked_documents", name) == 1
            assert sample(result, "yrelay_webhook_latency_seconds_count", name) == 6

            # Fixed receiver, retried by the operator: everything from the last ack arrives, in order.
            receiver.status.clear()
            retried = await http.post(f"/ops/groups/{name}/dead-letters/poison/retry", headers=AUTH)
            assert retried.status_code == 200, retried.text
            await eventually(lambda: receiver.accepted("poison") == written["poison"] + more["poison"], timeout=10)
            assert (await http.post(f"/ops/groups/{name}/dead-letters/poison/retry", headers=AUTH)).status_code == 404
            assert (await http.get(f"/ops/groups/{name}/dead-letters", headers=AUTH)).json()["dead_letters"] == []
            assert (await http.get(f"/ops/groups/{name}/dead-letters")).status_code == 401
            await _stop(task)


async def test_a_rejected_document_is_parked_at_once_and_stays_parked_on_another_member(redis_client, store):
    written = await write(store, ["rejected", "fine"], 1)
    receiver = Receiver()
    receiver.status["rejected"] = 422
    port, url = free_port(), ""
    url = f"http://127.0.0.1:{port}/hook"
    async with serving(receiver.app, port):
        async with ConsumerGroup(redis_client, "hooks-4xx-dead", member="w1", lease=LEASE) as first:
            webhook = Webhook(first, url, SECRET, backoff=FAST)  # the default max_attempts
            task = await _run(webhook)
            await eventually(lambda: webhook.stats.dead_letters == 1 and webhook.stats.delivered == 1, timeout=15)
            await _stop(task)
        assert len(receiver.seen["rejected"]) == 1  # a 4xx other than 408/429: parked at once
        # w1 left: the next member takes both documents; the parked one stays parked there.
        more = await write(store, ["rejected", "fine"], 1, word="more")
        async with ConsumerGroup(redis_client, "hooks-4xx-dead", member="w2", lease=LEASE) as second:
            webhook = Webhook(second, url, SECRET, backoff=FAST)
            task = await _run(webhook)
            await eventually(lambda: receiver.accepted("fine") == written["fine"] + more["fine"], timeout=15)
            await asyncio.sleep(0.3)
            assert len(receiver.seen["rejected"]) == 1
            receiver.status.clear()
            assert await DeadLetters(redis_client, "hooks-4xx-dead").retry_all() == 1
            await eventually(
                lambda: receiver.accepted("rejected") == written["rejected"] + more["rejected"], timeout=10
            )
            await _stop(task)


async def test_an_unreachable_receiver_parks_nothing(redis_client, store):
    """Connection refused is no document's fault: retried for as long as it takes."""
    written = await write(store, ["patient"], 1)
    receiver = Receiver()
    port = free_port()  # nothing listens yet
    async with ConsumerGroup(redis_client, "hooks-down", member="w1", lease=LEASE) as group:
        webhook = Webhook(group, f"http://127.0.0.1:{port}/hook", SECRET, backoff=FAST, max_attempts=2)
        task = await _run(webhook)
        await eventually(lambda: webhook.stats.failed >= 6, timeout=10)
        assert webhook.stats.dead_letters == 0
        async with serving(receiver.app, port):
            await eventually(lambda: receiver.accepted("patient") == written["patient"], timeout=10)
        await _stop(task)


async def test_the_cli_retries_every_dead_letter_of_a_group(redis_url, redis_client):
    import sys

    from yrelay.consumers.dead_letters import DeadLetter

    dead = DeadLetters(redis_client, "cli-dead")
    for doc in ("a", "b"):
        await dead.park(DeadLetter(doc, f"{doc}:1-0:1-0", "HTTP 500", 8, 1.0, "m"))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "yrelay.cli",
        "webhook",
        "--group",
        "cli-dead",
        "--retry-dead",
        "--redis-url",
        redis_url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, stderr.decode()
    assert "retried 2 dead letter(s) of group cli-dead" in stdout.decode()
    assert await dead.all() == []
