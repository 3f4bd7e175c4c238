"""The servers under test, each started fresh as a child process: yrelay (on
its own redis-server, appendfsync always), pycrdt-websocket, the y-websocket
1.5.4 Node server, and a bare uvicorn broadcast server (the web stack's
ceiling)."""

from __future__ import annotations

from yrelay_tools.bench.targets.base import Target
from yrelay_tools.bench.targets.servers import (
    TARGETS,
    BroadcastTarget,
    NodeYWebsocketTarget,
    PycrdtTarget,
    YrelayTarget,
    make_target,
)

__all__ = [
    "BroadcastTarget",
    "NodeYWebsocketTarget",
    "PycrdtTarget",
    "TARGETS",
    "Target",
    "YrelayTarget",
    "make_target",
]
