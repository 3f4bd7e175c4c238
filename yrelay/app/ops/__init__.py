"""Operator endpoints under ``/ops``: GC on demand, document and lag
inspection, eviction and deletion by hand, token revocation, consumer
groups and their dead letters. All behind a bearer token of their own
(``YRELAY_OPS_TOKEN``, :mod:`.bearer`), separate from anything clients hold:
without a configured token the endpoints are off (403), a missing token is
401, a wrong one 403, whatever the body: a body is read only after the
token, and at most 64 KiB of it (:mod:`yrelay.app.http_body`).

Each module holds the routes of one noun on a router of its own, with no
check of its own: :data:`router` includes them all under ``/ops``, behind
the token.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from yrelay.app.ops import dead_letters, documents, gc, groups, tokens
from yrelay.app.ops.bearer import require_ops_token

router = APIRouter(prefix="/ops", tags=["ops"], dependencies=[Depends(require_ops_token)])
router.include_router(gc.router)
router.include_router(documents.router)
router.include_router(tokens.router)
router.include_router(dead_letters.router)
router.include_router(groups.router)

__all__ = ["require_ops_token", "router"]
