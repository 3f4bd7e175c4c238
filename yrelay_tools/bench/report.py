"""Tables of a benchmark run (rich for the terminal, markdown for
BENCHMARKS.md) and the ratios the issue's goals are judged by."""

from __future__ import annotations

import math
import platform
from dataclasses import dataclass, field
from typing import Any

from yrelay_tools.bench.load import GENERATOR_BUSY, RunResult
from yrelay_tools.bench.scenarios import CatchupResult, IdleResult, LadderResult

RSS_GOAL = 20 * 1024  # bytes of server RSS per idle connection


@dataclass
class Report:
    command: str
    machine: str = ""
    ladders: list[LadderResult] = field(default_factory=list)
    catchup: list[CatchupResult] = field(default_factory=list)
    idle: list[IdleResult] = field(default_factory=list)

    # ------------------------------------------------------------ figures

    def best(self, ladder: LadderResult, target: str) -> RunResult | None:
        """The target's highest sustained step (most deliveries per second)."""
        runs = [run for run in ladder.runs if run.target == target and run.sustained]
        return max(runs, key=lambda run: run.deliveries_per_s, default=None)

    def goals(self) -> list[tuple[str, str, bool | None]]:
        """``(goal, measured, held)``; held is None when it was not measured."""
        out: list[tuple[str, str, bool | None]] = []
        for ladder in self.ladders:
            if ladder.scenario == "hot":
                out.extend(self._hot_goals(ladder))
            elif ladder.scenario == "many":
                out.extend(self._many_goals(ladder))
        ours = [c for c in self.catchup if c.server == "yrelay"]
        if len(ours) == 2:
            stream, resync = ours
            ratio = resync.seconds / stream.seconds
            out.append(
                (
                    "(c) catch-up >= 5x faster than a full state resync",
                    f"{stream.seconds:.2f} s vs {resync.seconds:.2f} s: {ratio:.1f}x; peak RSS growth "
                    f"{stream.peak_rss_growth / 2**20:.1f} MB vs {resync.peak_rss_growth / 2**20:.1f} MB",
                    ratio >= 5,
                )
            )
        for result in self.idle:
            if result.target == "yrelay":
                out.append(
                    (
                        "(d) <= 20 kB server RSS per idle connection",
                        f"{result.per_connection / 1024:.1f} kB",
                        result.per_connection <= RSS_GOAL,
                    )
                )
        return out

    def _hot_goals(self, ladder: LadderResult) -> list[tuple[str, str, bool | None]]:
        ours = self.best(ladder, "yrelay")
        out: list[tuple[str, str, bool | None]] = []
        for name in ("pycrdt-websocket", "y-websocket 1.5.4 (Node)"):
            theirs = self.best(ladder, name)
            if ours is None or theirs is None:
                continue
            ratio = ours.deliveries_per_s / theirs.deliveries_per_s
            limited = " (generator-limited)" if ours.generator_limited or theirs.generator_limited else ""
            out.append(
                (
                    f"(a) deliveries/s >= 1.0x {name}",
                    f"{ours.deliveries_per_s:,.0f} vs {theirs.deliveries_per_s:,.0f}: {ratio:.2f}x{limited}",
                    ratio >= 1.0 if name == "pycrdt-websocket" else None,
                )
            )
            common = self._common_rate(ladder, "yrelay", name)
            if common is not None:
                a, b = common
                ratio = a.p99_ms / b.p99_ms if b.p99_ms else math.inf
                out.append(
                    (
                        f"(a) p99 <= 1.0x {name} (at {a.rate:,.0f} updates/s, the highest rate both sustain)",
                        f"{a.p99_ms:,.1f} ms vs {b.p99_ms:,.1f} ms: {ratio:.2f}x",
                        ratio <= 1.0 if name == "pycrdt-websocket" else None,
                    )
                )
        return out

    def _common_rate(self, ladder: LadderResult, one: str, other: str) -> tuple[RunResult, RunResult] | None:
        mine = {run.rate: run for run in ladder.runs if run.target == one and run.sustained}
        theirs = {run.rate: run for run in ladder.runs if run.target == other and run.sustained}
        common = sorted(set(mine) & set(theirs))
        return (mine[common[-1]], theirs[common[-1]]) if common else None

    def _many_goals(self, ladder: LadderResult) -> list[tuple[str, str, bool | None]]:
        ours = self.best(ladder, "yrelay")
        ceiling = ladder.ceilings.get("pipelined XADD")
        if ours is None or not ceiling or not ours.acked_per_s:
            return [("(b) acked updates/s >= 50% of pipelined XADD", "no sustained yrelay step", False)]
        ratio = ours.acked_per_s / ceiling
        return [
            (
                "(b) acked updates/s >= 50% of pipelined XADD",
                f"{ours.acked_per_s:,.0f} vs {ceiling:,.0f}: {ratio:.2f}",
                ratio >= 0.5,
            )
        ]

    # ------------------------------------------------------------ output

    def markdown(self) -> str:
        lines = [f"Machine: {self.machine or machine()}", "", "    " + self.command, ""]
        for ladder in self.ladders:
            lines += [f"### Scenario {ladder.scenario}", "", *_ladder_markdown(ladder), ""]
            for target, ceiling in generator_ceilings(ladder).items():
                lines.append(
                    f"Generator ceiling against {target}: ~{ceiling:,.0f} deliveries/s (median over the "
                    "steps of deliveries/s divided by the busiest generator process's CPU share)."
                )
            lines.append("")
            for name, value in ladder.ceilings.items():
                lines.append(f"Ceiling, {name} (same run, same redis-server config): {value:,.0f}/s")
                lines.append("")
        if self.catchup:
            lines += _table(
                "catchup",
                [
                    "server",
                    "path",
                    "entries",
                    "seconds",
                    "frames",
                    "server peak RSS growth (MB)",
                    "server RSS before (MB)",
                    "note",
                ],
                [
                    [
                        c.server,
                        c.path,
                        f"{c.entries:,}",
                        f"{c.seconds:.2f}",
                        f"{c.frames:,}",
                        f"{c.peak_rss_growth / 2**20:.1f}",
                        f"{c.server_rss_before / 2**20:.1f}",
                        c.note,
                    ]
                    for c in self.catchup
                ],
            )
        if self.idle:
            lines += _table(
                "idle",
                [
                    "server",
                    "connections",
                    "RSS before (MB)",
                    "RSS after (MB)",
                    "kB per connection",
                    "connect s",
                    "note",
                ],
                [
                    [
                        i.target,
                        f"{i.connections:,}",
                        f"{i.rss_before / 2**20:.1f}",
                        f"{i.rss_after / 2**20:.1f}",
                        f"{i.per_connection / 1024:.1f}",
                        f"{i.connect_seconds:.1f}",
                        i.note,
                    ]
                    for i in self.idle
                ],
            )
        goals = self.goals()
        if goals:
            lines += ["### Goals", "", "| goal | measured | held |", "| --- | --- | --- |"]
            for goal, measured, held in goals:
                lines.append(f"| {goal} | {measured} | {_held(held)} |")
            lines.append("")
        return "\n".join(lines)

    def print(self) -> None:
        """The tables on the terminal (rich renders the markdown; wide, so the columns stay columns)."""
        from rich.console import Console
        from rich.markdown import Markdown

        Console(width=max(200, Console().width)).print(Markdown(self.markdown()))

    def as_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "machine": self.machine or machine(),
            "ladders": [
                {"scenario": ladder.scenario, "ceilings": ladder.ceilings, "runs": [r.as_dict() for r in ladder.runs]}
                for ladder in self.ladders
            ],
            "catchup": [c.__dict__ for c in self.catchup],
            "idle": [dict(i.__dict__, per_connection=i.per_connection) for i in self.idle],
            "goals": [{"goal": g, "measured": m, "held": h} for g, m, h in self.goals()],
        }


def generator_ceilings(ladder: LadderResult) -> dict[str, float]:
    """Per target, what the generator could absorb at 100% of its busiest
    process: its own ceiling (each protocol costs the generator differently)."""
    out: dict[str, float] = {}
    for target in dict.fromkeys(run.target for run in ladder.runs):
        estimates = sorted(
            run.deliveries_per_s / run.generator_busy
            for run in ladder.runs
            if run.target == target and run.generator_busy > 0.02
        )
        if estimates:
            out[target] = estimates[len(estimates) // 2]
    return out


def _ladder_markdown(ladder: LadderResult) -> list[str]:
    lines = [
        "| server | offered updates/s | acked updates/s | deliveries/s | p50 ms | p99 ms | max ms | "
        "server CPU s per 1k updates | RSS per connection kB | Redis per doc kB | generator busy | kept up | "
        "note |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in ladder.runs:
        cpu = " + ".join(f"{v / max(1, r.updates) * 1000:.2f}" for v in r.cpu.values())
        acked = f"{r.acked_per_s:,.0f}" if r.acked_per_s else "no acks"
        redis = f"{r.redis_memory_per_doc / 1024:.1f}" if r.redis_memory_per_doc is not None else ""
        kept = "yes" if r.sustained else ("incomplete" if not r.complete else "fell behind")
        busy = f"{r.generator_busy:.2f}" + (" (generator-limited)" if r.generator_limited else "")
        lines.append(
            f"| {r.target} | {r.rate:,.0f} | {acked} | {r.deliveries_per_s:,.0f} | {r.p50_ms:,.1f} | "
            f"{r.p99_ms:,.1f} | {r.max_ms:,.0f} | {cpu} | {r.rss_per_connection / 1024:.1f} | {redis} | "
            f"{busy} | {kept} | {r.note} |"
        )
    return lines


def _table(scenario: str, header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table: names and notes left-aligned, numbers right."""
    text = {"server", "path", "note"}
    align = ["---" if name in text else "---:" for name in header]
    return [
        f"### Scenario {scenario}",
        "",
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(align) + " |",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]


def _held(held: bool | None) -> str:
    return "reported" if held is None else ("yes" if held else "**no**")


def machine() -> str:
    import os

    cpus = os.cpu_count()
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor()
    try:
        mem = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal"))) / 2**20
    except (OSError, StopIteration):
        mem = 0
    return (
        f"{cpus} cores ({model}), {mem:.0f} GiB, Python {platform.python_version()}, "
        f"generator processes flagged at {GENERATOR_BUSY:.0%} busy"
    )
