"""A validator worker that hangs on any update containing ``HANG`` (as an
engine call that never returns would), for tests of the deadline."""

from __future__ import annotations

import sys
import time

from yrelay.yjs import validation

_check = validation.check


def check(update: bytes, with_ypy: bool = False) -> str:
    if b"HANG" in update:
        time.sleep(3600)
    return _check(update, with_ypy)


if __name__ == "__main__":
    validation.check = check  # type: ignore[assignment]
    validation.serve(sys.stdin.buffer, sys.stdout.buffer)
