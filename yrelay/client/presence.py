"""Other clients' presence (Yjs awareness) on one document, as the Python
client sees it: the same rules as y-protocols' ``applyAwarenessUpdate``, so
a Python client and a browser agree on who is there.

The Python client does not publish a state of its own; it reads what the
server relays (docs/protocol.md#presence). States not renewed within
``OUTDATED_AFTER`` seconds are dropped, as y-protocols does, which also
bounds what a long-running client keeps.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from yrelay.yjs.awareness import decode_update

#: Seconds a remote state lives without renewal (y-protocols' outdatedTimeout,
#: the server's default ``presence_timeout``).
OUTDATED_AFTER = 30.0
#: Entries read from one frame: the server's greeting carries every other
#: client of the document (it caps them at 500 per document).
MAX_ENTRIES = 1000


@dataclass
class RemotePresence:
    """clientID -> decoded state, with the clock and the time it was last renewed."""

    states: dict[int, dict[str, Any]] = field(default_factory=dict)
    _clocks: dict[int, int] = field(default_factory=dict)
    _renewed: dict[int, float] = field(default_factory=dict)

    def apply(self, data: bytes, now: float | None = None) -> dict[str, list[int]]:
        """Apply an encoded update (:class:`~yrelay.yjs.awareness.AwarenessError`
        if it is malformed); a newer clock wins, and a ``null`` state at the
        same or a newer clock removes the entry. Returns what changed."""
        now = time.monotonic() if now is None else now
        changes: dict[str, list[int]] = {"added": [], "updated": [], "removed": []}
        for entry in decode_update(data, MAX_ENTRIES):
            known = self._clocks.get(entry.client_id)
            newer = known is None or entry.clock > known
            if not (newer or (entry.removed and entry.clock == known and entry.client_id in self.states)):
                continue  # a clock already seen: y-protocols ignores it too
            self._clocks[entry.client_id], self._renewed[entry.client_id] = entry.clock, now
            if entry.removed:
                if self.states.pop(entry.client_id, None) is not None:
                    changes["removed"].append(entry.client_id)
                continue
            state = json.loads(entry.state)
            previous = self.states.get(entry.client_id)
            self.states[entry.client_id] = state
            if previous is None:
                changes["added"].append(entry.client_id)
            elif previous != state:
                changes["updated"].append(entry.client_id)
        changes["removed"] += self.expire(now)
        return changes

    def expire(self, now: float | None = None) -> list[int]:
        """Forget clients not renewed within ``OUTDATED_AFTER``; returns
        those whose state was still held."""
        now = time.monotonic() if now is None else now
        old = [client for client, renewed in self._renewed.items() if now - renewed >= OUTDATED_AFTER]
        for client in old:
            del self._clocks[client], self._renewed[client]
        return [client for client in old if self.states.pop(client, None) is not None]

    def clear(self) -> None:
        """Offline: remote states would freeze; the server's greeting on the
        next subscribe brings them back (with clocks we must not compare to old ones)."""
        self.states.clear()
        self._clocks.clear()
        self._renewed.clear()


__all__ = ["MAX_ENTRIES", "OUTDATED_AFTER", "RemotePresence"]
