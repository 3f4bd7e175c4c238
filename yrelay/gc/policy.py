"""What a GC pass is allowed to do, in one immutable object."""

from __future__ import annotations

from dataclasses import dataclass

from yrelay.config import Settings


@dataclass(frozen=True)
class GcPolicy:
    #: Evict sessions lacking an entry this much older than the leader's (ms).
    relative_ms: int = 30_000
    #: With no healthy session: evict those lacking an entry this old (ms).
    absolute_ms: int = 1_800_000
    #: Entries folded (and trimmed) per document per round.
    max_fold_entries: int = 10_000
    #: Evicted session ids reported per document (the count is always exact).
    max_reported_sessions: int = 20
    #: Evict a consumer group with no live member lacking an entry this much
    #: older than the newest (ms); a live group lacking one this old (ms).
    group_abandoned_ms: int = 600_000
    group_absolute_ms: int = 86_400_000

    @classmethod
    def from_settings(cls, settings: Settings) -> GcPolicy:
        return cls(
            relative_ms=round(settings.gc_relative_delta * 1000),
            absolute_ms=round(settings.gc_absolute_delta * 1000),
            max_fold_entries=settings.gc_max_fold_entries,
            group_abandoned_ms=round(settings.gc_group_abandoned_delta * 1000),
            group_absolute_ms=round(settings.gc_group_absolute_delta * 1000),
        )
