"""What the generator reads about the processes under test: CPU seconds and
resident memory from /proc (Linux), Redis memory from INFO, and latency
percentiles."""

from __future__ import annotations

import math
import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15)


def _status(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    return 0


def rss(pid: int) -> int:
    """Resident set size of ``pid`` in bytes."""
    return _status(pid, "VmRSS")


def peak_rss(pid: int) -> int:
    """Peak resident set size since start, or since :func:`reset_peak`."""
    return _status(pid, "VmHWM")


def reset_peak(pid: int) -> bool:
    """Start measuring the peak RSS of ``pid`` from now (Linux clear_refs 5)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class CpuMeter:
    """CPU seconds of some processes (or groups of processes) between two moments."""

    def __init__(self, pids: dict[str, int | tuple[int, ...]]):
        self.pids = pids
        self.start = {name: _group_cpu(pid) for name, pid in pids.items()}

    def used(self) -> dict[str, float]:
        return {name: _group_cpu(pid) - self.start[name] for name, pid in self.pids.items()}


def _group_cpu(pids: int | tuple[int, ...]) -> float:
    """A process's CPU seconds, or a group's sum; a member that has exited
    (a restarted worker) counts what it had when last seen as 0 (rare)."""
    if isinstance(pids, int):
        return cpu_seconds(pids)
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:
            pass
    return total


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (nan when empty)."""
    if not sorted_values:
        return float("nan")
    return sorted_values[max(0, math.ceil(fraction * len(sorted_values)) - 1)]


def redis_used_memory(url: str) -> int:
    """``used_memory`` of the Redis at ``url``, in bytes."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.info("memory")["used_memory"])
    finally:
        client.close()
