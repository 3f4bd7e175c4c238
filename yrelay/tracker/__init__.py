"""The tracker: each session's acknowledged offset per document."""

from yrelay.tracker.tracker import AckWriter, Tracker

__all__ = ["AckWriter", "Tracker"]
