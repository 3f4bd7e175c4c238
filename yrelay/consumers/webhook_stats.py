"""Webhook counters, summed over the members of a group in Redis.

A webhook runs in its own process (``yrelay webhook``), often several per
group, on hosts Prometheus may not reach. Rather than a metrics port per
process, each member adds what it counted to one hash per group
(``keys.group_webhook_stats_key``) about once a second, and the server's
``/metrics`` (which already reads the groups from Redis) exports the sums:
one scrape target, totals that survive a member's restart, and the
per-group view an operator wants. A member that dies loses at most its
last second of counts.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.asyncio import Redis

from yrelay.storage.keys import group_dead_letters_key, group_webhook_stats_key
from yrelay.storage.replies import text

#: Upper bounds (seconds) of the delivery latency histogram: one request, sent to answered.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_COUNTERS = ("delivered", "failed", "rejected", "retries", "dead_letters", "dropped", "refused_acks")


@dataclass
class WebhookStats:
    """One member's counts since it started."""

    delivered: int = 0  # batches answered 2xx and acked
    failed: int = 0  # attempts lost to the network, a timeout, 5xx, 408 or 429
    rejected: int = 0  # attempts answered with another 4xx
    retries: int = 0  # attempts after the first of their batch
    dead_letters: int = 0  # documents this member parked
    dropped: int = 0  # batches not sent: the document moved to another member (or was parked) first
    refused_acks: int = 0  # 2xx answered, the ack refused (STALE or EVICTED): redelivered elsewhere
    latency_sum: float = 0.0
    #: Answered requests per latency bucket (the last: above every bound), not cumulative.
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))

    def observe(self, seconds: float) -> None:
        """One answered request (any status) took ``seconds``."""
        self.latency_sum += seconds
        self.latency_counts[
            next((i for i, bound in enumerate(LATENCY_BUCKETS) if seconds <= bound), len(LATENCY_BUCKETS))
        ] += 1

    def fields(self) -> dict[str, int | float]:
        """The Redis hash fields: counters, ``latency_sum``, ``latency_<i>``
        (ints, but for the sum: each is added with the command of its type)."""
        out: dict[str, int | float] = {name: getattr(self, name) for name in _COUNTERS}
        out["latency_sum"] = self.latency_sum
        out.update({f"latency_{i}": count for i, count in enumerate(self.latency_counts)})
        return out


class StatsFlusher:
    """Adds to the group's hash what a member counted since the last flush."""

    def __init__(self, redis: Redis, group: str, stats: WebhookStats):
        self.redis = redis
        self.key = group_webhook_stats_key(group)
        self.stats = stats
        self._flushed: dict[str, int | float] = {name: 0 for name in stats.fields()}

    async def flush(self) -> None:
        now = self.stats.fields()
        deltas = {name: value - self._flushed[name] for name, value in now.items() if value != self._flushed[name]}
        if not deltas:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for name, delta in deltas.items():
                if isinstance(delta, float):
                    pipe.hincrbyfloat(self.key, name, delta)
                else:
                    pipe.hincrby(self.key, name, delta)
            await pipe.execute()
        self._flushed = now


@dataclass(frozen=True)
class GroupWebhookStats:
    """What ``/metrics`` shows of one group's webhooks."""

    group: str
    totals: WebhookStats
    #: Documents parked now (the dead-letter hash's size).
    parked: int


async def webhook_stats(redis: Redis, groups: list[str]) -> list[GroupWebhookStats]:
    """The summed counters of the groups that ran a webhook."""
    async with redis.pipeline(transaction=False) as pipe:
        for group in groups:
            pipe.hgetall(group_webhook_stats_key(group))
            pipe.hlen(group_dead_letters_key(group))
        replies = await pipe.execute()
    raws = [{text(k): text(v) for k, v in raw.items()} for raw in replies[::2]]
    return [
        GroupWebhookStats(group, _totals(raw), parked)
        for group, raw, parked in zip(groups, raws, replies[1::2], strict=True)
        if raw or parked
    ]


def _totals(raw: dict[str, str]) -> WebhookStats:
    return WebhookStats(
        **{name: int(float(raw.get(name, 0))) for name in _COUNTERS},
        latency_sum=float(raw.get("latency_sum", 0)),
        latency_counts=[int(raw.get(f"latency_{i}", 0)) for i in range(len(LATENCY_BUCKETS) + 1)],
    )


class WebhookCollector(Collector):
    """The groups' webhook counters on ``/metrics``, as read by the last refresh."""

    def __init__(self) -> None:
        self.stats: list[GroupWebhookStats] = []

    async def refresh(self, redis: Redis, groups: list[str]) -> None:
        self.stats = await webhook_stats(redis, groups)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Any]:
        counters = [
            ("delivered", "Batches a group's webhooks delivered (answered 2xx and acked)."),
            ("failed", "Webhook attempts lost to the network, a timeout, 5xx, 408 or 429."),
            ("rejected", "Webhook attempts answered with another 4xx."),
            ("retries", "Webhook attempts after the first of their batch."),
            ("dead_letters", "Documents a group's webhooks parked (dead letters)."),
        ]
        for attribute, doc in counters:
            family = CounterMetricFamily(f"yrelay_webhook_{attribute}", doc, labels=["group"])
            for item in self.stats:
                family.add_metric([item.group], getattr(item.totals, attribute))
            yield family
        parked = GaugeMetricFamily(
            "yrelay_webhook_parked_documents", "Documents parked now, per group.", labels=["group"]
        )
        latency = HistogramMetricFamily(
            "yrelay_webhook_latency_seconds", "Webhook requests, sent to answered (any status).", labels=["group"]
        )
        for item in self.stats:
            parked.add_metric([item.group], item.parked)
            cumulative = list(itertools.accumulate(item.totals.latency_counts))
            buckets = [(str(bound), count) for bound, count in zip(LATENCY_BUCKETS, cumulative, strict=False)]
            latency.add_metric([item.group], buckets + [("+Inf", cumulative[-1])], item.totals.latency_sum)
        yield parked
        yield latency
