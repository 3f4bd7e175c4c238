"""Consumer groups: durable, shared, resumable feeds of every document's
changes for services (search indexers, backups, exports); docs/consumers.md."""

from __future__ import annotations

from yrelay.consumers.batch import Batch
from yrelay.consumers.group import ConsumerGroup
from yrelay.consumers.progress import AckResult
from yrelay.consumers.state import DocumentStates

__all__ = ["AckResult", "Batch", "ConsumerGroup", "DocumentStates"]
