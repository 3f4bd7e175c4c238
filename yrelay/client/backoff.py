"""Exponential backoff with jitter and a maximum, shared by retries and
reconnects (the schedule lives in :mod:`yrelay.backoff`, which the server's
reconnect loops use too)."""

from __future__ import annotations

from ..backoff import Backoff

__all__ = ["Backoff"]
