"""Run a command while a CPU hog keeps every core busy (``make test-busy``).

    python -m yrelay_tools.testing.busy [--hogs N] -- COMMAND [ARG...]

Starts ``N`` processes (default: one per core) that spin at normal priority
for as long as ``COMMAND`` runs, stops them when it ends, and exits with its
status. Run under it, a test suite sees what it sees on a shared CI machine:
a test that waits for elapsed time instead of for a condition, or counts
what depends on scheduling, fails here and not on a quiet laptop. A test
that passes here tells a real failure from a slow machine.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

from yrelay.storage.embedded import _die_with_parent

#: What each hog runs: nothing but CPU (no memory, no I/O).
SPIN = "while True: pass"


def start_hogs(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` spinning processes; each dies with this one, even by SIGKILL."""
    return [subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=_die_with_parent) for _ in range(count)]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        hog.kill()
    for hog in hogs:
        hog.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m yrelay_tools.testing.busy", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--hogs", type=int, default=os.cpu_count() or 2, help="spinning processes (default: one per core)"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    hogs = start_hogs(args.hogs)
    print(f"busy: {len(hogs)} CPU hogs running beside: {' '.join(command)}", file=sys.stderr, flush=True)
    try:
        child = subprocess.Popen(command)
        try:
            return child.wait()
        except KeyboardInterrupt:  # Ctrl-C reached the command too; let it finish its report
            child.send_signal(signal.SIGINT)
            return child.wait()
    finally:
        stop_hogs(hogs)


if __name__ == "__main__":
    sys.exit(main())
