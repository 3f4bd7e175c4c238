"""Where a server's latency spikes come from: put this directory first on a
server's ``PYTHONPATH`` and every stall it has is written to
``$STALL_LOG`` (default ``/tmp/stall_probe.log``) with a wall-clock time, to
set beside a bench timeline (``bench/hot_timeline.py``) and the event log
(``STALL_THRESHOLD`` seconds, default 0.03, for LAG, HELD and young collections):

- ``LAG``: the event loop took more than 30 ms to run a callback another
  thread scheduled every 5 ms (anything that holds the loop);
- ``GC``: every full collection of Python's cyclic GC, with its duration and
  the objects left (counted after the duration is taken; the counting adds
  to a LAG or HELD around it);
- ``HELD``: 30 ms or more in which the frame right above the event loop
  stayed the same (which task held it), with the deepest frames seen.

Found the many-documents p99 of issue 20 (BENCHMARKS.md "Issue 20: many"):
no LAG, no GC and no HELD during the bursts, which pointed away from the
server's loop to the engine workers' start-up. Only in processes started
with ``serve`` in their arguments; for example::

    cd /tmp && PYTHONPATH=/work/main /work/main/.venv/bin/python /work/main/bench/hot_timeline.py \\
        --target "yrelay+PYTHONPATH=/work/main/bench/stall_probe:/work/main" --scenario many --rate 4000
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
import time

OUT = os.environ.get("STALL_LOG", "/tmp/stall_probe.log")
THRESHOLD = float(os.environ.get("STALL_THRESHOLD", "0.03"))


def _write(line: str) -> None:
    with open(OUT, "a") as out:
        out.write(f"{time.time():.3f} pid {os.getpid()} {line}\n")


def _on_gc(phase: str, info: dict, started: list[float] = [0.0]) -> None:  # noqa: B006 - state between calls
    if phase == "start":
        started[0] = time.perf_counter()
    elif info["generation"] == 2:
        _write(
            f"GC full collection {1000 * (time.perf_counter() - started[0]):.0f} ms, "
            f"{len(gc.get_objects())} objects, {info['collected']} collected"
        )
    elif time.perf_counter() - started[0] >= THRESHOLD:
        _write(
            f"GC generation {info['generation']} {1000 * (time.perf_counter() - started[0]):.1f} ms, "
            f"{info['collected']} collected"
        )


def _lag_probe(loop: asyncio.AbstractEventLoop) -> None:
    ran = threading.Event()
    while not loop.is_closed():
        ran.clear()
        asked = time.perf_counter()
        try:
            loop.call_soon_threadsafe(ran.set)
        except RuntimeError:  # closed meanwhile
            return
        ran.wait(10)
        lag = time.perf_counter() - asked
        if lag > THRESHOLD:
            _write(f"LAG {1000 * lag:.0f} ms")
        time.sleep(0.005)


def _frames(frame) -> list[str]:  # type: ignore[no-untyped-def]
    names = []
    while frame is not None:
        names.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno})")
        frame = frame.f_back
    return names[::-1]


def _held_probe(main: int) -> None:
    holder, since, leaves = None, time.perf_counter(), {}
    while True:
        time.sleep(0.002)
        frame = sys._current_frames().get(main)
        if frame is None:
            return
        names = _frames(frame)
        loop_at = max(
            (i for i, name in enumerate(names) if name.startswith(("run (runners.py", "Runner.run"))), default=-1
        )
        above = names[loop_at + 1 :]
        now, key = time.perf_counter(), (above[0].split(":")[0] if above else None)
        if key != holder:
            if holder is not None and now - since >= THRESHOLD:
                top = sorted(leaves.items(), key=lambda item: -item[1])[:3]
                _write(
                    f"HELD {1000 * (now - since):.0f} ms by {holder}: " + " | ".join(f"{n}x {leaf}" for leaf, n in top)
                )
            holder, since, leaves = key, now, {}
        if above:
            leaf = " < ".join(above[-3:][::-1])
            leaves[leaf] = leaves.get(leaf, 0) + 1


def _install() -> None:
    gc.callbacks.append(_on_gc)
    threading.Thread(target=_held_probe, args=(threading.main_thread().ident,), daemon=True).start()
    set_running = asyncio.events._set_running_loop  # uvloop and asyncio both call it when a loop starts

    def capture(loop):  # type: ignore[no-untyped-def]
        if loop is not None and threading.current_thread() is threading.main_thread():
            threading.Thread(target=_lag_probe, args=(loop,), daemon=True).start()
        set_running(loop)

    asyncio.events._set_running_loop = capture
    asyncio._set_running_loop = capture  # type: ignore[attr-defined]


if "serve" in sys.argv:
    _install()
