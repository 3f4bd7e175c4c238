"""``yrelay bench``: a load generator (separate processes) that drives
realistic Yjs traffic at yrelay and at the reference servers side by side,
and reports throughput, latency, CPU and memory (BENCHMARKS.md).

Modules: ``edits`` (the traffic), ``wsclient`` + ``drivers`` (the two wire
protocols), ``worker`` (one generator process), ``load`` (shapes and one
measured run), ``targets`` (the servers under test), ``scenarios``,
``ceilings``, ``metrics``, ``report``, ``run``.
"""

from __future__ import annotations

from yrelay_tools.bench.run import ALL_TARGETS, SCENARIOS, BenchConfig, run_bench

__all__ = ["ALL_TARGETS", "SCENARIOS", "BenchConfig", "run_bench"]
