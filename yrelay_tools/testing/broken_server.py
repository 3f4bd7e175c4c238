"""A deliberately broken ``yrelay serve``, for one test only: the one that
proves the chaos checker catches a server that loses acknowledged updates
(tests/test_chaos.py). Nothing else imports it; never deploy it.

    python -m yrelay_tools.testing.broken_server serve --port ... --redis-url ...

runs the real command with one bug patched in, in this process only: the
server sends ``appended`` *before* the append script ran (the id is made
up). While Redis is up the append follows and nothing shows; when the append
fails (Redis is down), the client has already dropped the update from its
send buffer, so nobody ever stores it and the other replicas never get it.
"""

from __future__ import annotations

import asyncio
import time

from yrelay.app.core.write_path import WritePath
from yrelay.cli import cli


async def _ack_before_append(
    self: WritePath, frame, future: asyncio.Future[tuple[str, bool]], size: int, received: float
) -> None:
    try:
        made_up = f"{int(time.time() * 1000)}-0"
        await self._peer.appended(frame.doc, frame.clock, made_up, False, {})
        await future
    except Exception:  # noqa: BLE001 - whatever the append raised, this deliberately broken server already said stored
        pass  # the client was told it is stored
    finally:
        self._inflight.release(size)


def main() -> None:
    WritePath._confirm = _ack_before_append  # type: ignore[method-assign]
    cli()


if __name__ == "__main__":
    main()
