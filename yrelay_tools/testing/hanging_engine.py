"""An engine worker that hangs on a request carrying ``HANG`` and dies on
one carrying ``DIE`` (as a Rust abort would), for tests of the engine
pool's deadline and restarts."""

from __future__ import annotations

import os
import sys
import time

from yrelay.yjs import engine

_answer = engine.answer


def answer(tag: int, items: list[bytes], with_ypy: bool = False) -> bytes:
    if any(b"HANG" in item for item in items):
        time.sleep(3600)
    if any(b"DIE" in item for item in items):
        os.abort()
    return _answer(tag, items, with_ypy)


if __name__ == "__main__":
    engine.answer = answer  # type: ignore[assignment]
    engine.serve(sys.stdin.buffer, sys.stdout.buffer)
