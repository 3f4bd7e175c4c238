"""A whole ``yrelay bench`` run: the chosen scenarios against every target,
one after the other on this machine, into one :class:`Report`."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from yrelay_tools.bench import scenarios
from yrelay_tools.bench.report import Report
from yrelay_tools.bench.scenarios import Progress

SCENARIOS = ("hot", "many", "catchup", "idle")
ALL_TARGETS = ("yrelay", "pycrdt", "node", "broadcast")


@dataclass
class BenchConfig:
    scenarios: tuple[str, ...] = SCENARIOS
    targets: tuple[str, ...] = ALL_TARGETS
    #: Offered updates per second, ascending, per scenario.
    hot_rates: list[float] = field(default_factory=lambda: [100, 250, 500, 1000, 2000, 4000, 8000, 16000])
    many_rates: list[float] = field(default_factory=lambda: [500, 1000, 2000, 4000, 8000, 16000])
    duration: float = 5.0
    readers: int = 50
    writers: int = 2
    docs: int = 1000
    entries: int = 100_000
    connections: int = 10_000
    #: Clients offer permessage-deflate as Chromium does (scenarios hot, many, idle).
    deflate: bool = True


def run_bench(config: BenchConfig, command: str, progress: Progress = print, work_dir: Path | None = None) -> Report:
    report = Report(command=command)
    with tempfile.TemporaryDirectory(prefix="yrelay-bench-") as tmp:
        work = work_dir or Path(tmp)
        for scenario in config.scenarios:
            if scenario == "hot":
                report.ladders.append(
                    scenarios.hot(
                        config.targets,
                        config.hot_rates,
                        config.duration,
                        work,
                        progress,
                        readers=config.readers,
                        writers=config.writers,
                        deflate=config.deflate,
                    )
                )
            elif scenario == "many":
                report.ladders.append(
                    scenarios.many(
                        config.targets,
                        config.many_rates,
                        config.duration,
                        work,
                        progress,
                        docs=config.docs,
                        deflate=config.deflate,
                    )
                )
            elif scenario == "catchup":
                report.catchup = scenarios.catchup(config.targets, config.entries, work, progress)
            elif scenario == "idle":
                report.idle = scenarios.idle(config.targets, config.connections, work, progress, deflate=config.deflate)
            else:
                raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    return report
