"""Consumer groups: durable, shared, resumable feeds of every document's
changes for services (search indexers, backups, exports); docs/consumers.md."""

from __future__ import annotations

from .batch import Batch
from .group import ConsumerGroup
from .progress import AckResult
from .state import DocumentStates

__all__ = ["AckResult", "Batch", "ConsumerGroup", "DocumentStates"]
