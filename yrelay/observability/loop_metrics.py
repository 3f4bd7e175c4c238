"""Counters and histograms moved once per delivery or ack: plain numbers.

prometheus_client's metrics take a lock and check their arguments on every
call, and its histogram finds the bucket in a Python loop: a few
microseconds that a busy document paid per subscriber per batch (about 4%
of a server's CPU at 25,000 deliveries a second, BENCHMARKS.md "Issue 20:
hot p99"). These are only ever moved from the event loop's thread, so an
increment needs no lock, and a bisect finds the bucket. The registry reads
them at scrape time through :class:`LoopMetrics`, under the same names and
in the same exposition as prometheus_client's own.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

#: prometheus_client's bucket-bound formatting (untyped there), typed here once.
_go_float: Callable[[float], str] = floatToGoString


class LoopCounter:
    """A counter moved from one thread only."""

    __slots__ = ("name", "documentation", "value")

    def __init__(self, name: str, documentation: str):
        self.name = name
        self.documentation = documentation
        self.value: float = 0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class LoopHistogram:
    """A histogram moved from one thread only: a count per bucket (the
    last one is ``+Inf``) and the sum."""

    __slots__ = ("name", "documentation", "bounds", "counts", "sum")

    def __init__(self, name: str, documentation: str, bounds: Sequence[float]):
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bound >= value: Prometheus' "le"
        self.sum += value


class LoopMetrics(Collector):
    """The loop's counters and histograms, for a registry's scrape."""

    def __init__(self, registry: CollectorRegistry):
        self._metrics: list[LoopCounter | LoopHistogram] = []
        registry.register(self)

    def counter(self, name: str, documentation: str) -> LoopCounter:
        counter = LoopCounter(name, documentation)
        self._metrics.append(counter)
        return counter

    def histogram(self, name: str, documentation: str, bounds: Sequence[float]) -> LoopHistogram:
        histogram = LoopHistogram(name, documentation, bounds)
        self._metrics.append(histogram)
        return histogram

    def collect(self) -> Iterator[Metric]:
        for metric in self._metrics:
            if isinstance(metric, LoopCounter):
                yield CounterMetricFamily(metric.name, metric.documentation, value=metric.value)
                continue
            counts, running, buckets = list(metric.counts), 0, []
            for bound, count in zip([*metric.bounds, float("inf")], counts, strict=True):
                running += count
                buckets.append((_go_float(bound), running))
            yield HistogramMetricFamily(metric.name, metric.documentation, buckets=buckets, sum_value=metric.sum)

    def describe(self) -> Iterator[Metric]:
        """Names only (the registry checks for duplicates without collecting)."""
        for metric in self._metrics:
            if isinstance(metric, LoopCounter):
                yield CounterMetricFamily(metric.name, metric.documentation)
            else:
                yield HistogramMetricFamily(metric.name, metric.documentation)


__all__ = ["LoopCounter", "LoopHistogram", "LoopMetrics"]
