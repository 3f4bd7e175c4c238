"""``/ops/groups/{group}/dead-letters``: the documents a group's webhooks
parked (:mod:`yrelay.consumers.dead_letters`), and retrying them."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, HTTPException, status

from yrelay.app.binding import RelayEvents, RelayRedis
from yrelay.app.ops.names import doc_id, group_name
from yrelay.app.paths import DOC_PARAM
from yrelay.consumers.dead_letters import DeadLetters

router = APIRouter(prefix="/groups")


def _dead_letters(redis: RelayRedis, group: str) -> DeadLetters:
    return DeadLetters(redis, group_name(group))


@router.get("/{group}/dead-letters")
async def list_dead_letters(group: str, redis: RelayRedis) -> dict[str, Any]:
    """The documents the group's webhooks parked: the failed delivery, the
    last error, attempts, when and by which member. Nothing of them is sent
    until retried; their position (the last ack) is kept."""
    letters = await _dead_letters(redis, group).all()
    return {"group": group, "dead_letters": [asdict(letter) for letter in letters]}


@router.post("/{group}/dead-letters/" + DOC_PARAM + "/retry")
async def retry_dead_letter(group: str, doc: str, redis: RelayRedis, events: RelayEvents) -> dict[str, Any]:
    """Send the document again from its last ack: the member holding it
    resumes within a second (404 when it is not parked)."""
    dead = _dead_letters(redis, group)
    if not await dead.retry(doc_id(doc)):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{doc!r} is not parked in group {group!r}")
    events.emit("dead_letter_retry", doc, group=group)
    return {"group": group, "doc": doc, "retried": True}


@router.post("/{group}/dead-letters/retry")
async def retry_all_dead_letters(group: str, redis: RelayRedis, events: RelayEvents) -> dict[str, Any]:
    """Retry every parked document of the group."""
    retried = await _dead_letters(redis, group).retry_all()
    events.emit("dead_letter_retry", group=group)
    return {"group": group, "retried": retried}
