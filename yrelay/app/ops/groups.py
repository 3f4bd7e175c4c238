"""``/ops/groups``: consumer groups for operators (docs/operations.md). The
reading and the deleting live in :mod:`yrelay.consumers.admin`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, status

from yrelay.app.binding import RelayEvents, RelayRedis
from yrelay.app.ops.names import group_name
from yrelay.consumers.admin import delete_group, describe_group, list_groups

router = APIRouter(prefix="/groups")


@router.get("")
async def get_groups(redis: RelayRedis) -> dict[str, Any]:
    """Every consumer group: live members, leader, documents assigned, and
    its lag (entries handed out and not acked, age of the oldest)."""
    return {"groups": await list_groups(redis)}


@router.get("/{group}")
async def get_group(group: str, redis: RelayRedis) -> dict[str, Any]:
    """One group: members, leader, and per document its member, version,
    pending handover and lag behind the stream's newest entry."""
    detail = await describe_group(redis, group_name(group))
    if detail is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown consumer group {group!r}")
    return detail


@router.delete("/{group}")
async def remove_group(group: str, redis: RelayRedis, events: RelayEvents) -> dict[str, Any]:
    """Delete a group: its members stop at their next heartbeat, its keys
    and its progress on every document go (GC no longer holds streams for
    it). Answers the number of documents it had progress on. Recorded in the
    event log (``consumer_group_deleted``)."""
    cleared = await delete_group(redis, group_name(group))
    if cleared is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown consumer group {group!r}")
    events.emit("consumer_group_deleted", group=group, documents=cleared)
    return {"group": group, "documents_cleared": cleared}
