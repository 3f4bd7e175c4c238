"""Who may call ``/ops``: the bearer token of ``YRELAY_OPS_TOKEN``, checked
by the ops router (:mod:`yrelay.app.ops`) after the relay binding and before
any body is read (:mod:`yrelay.app.http_body`)."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from yrelay.app.binding import relay_settings

_bearer = HTTPBearer(auto_error=False, description="The ops token (YRELAY_OPS_TOKEN).")


def require_ops_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """403 while no token is configured (the endpoints are off), 401 without
    one, 403 for a wrong one (compared in constant time)."""
    expected = relay_settings(request).ops_token
    if not expected:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "ops endpoints are disabled: set YRELAY_OPS_TOKEN")
    if credentials is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "ops token required", headers={"WWW-Authenticate": "Bearer"})
    if not secrets.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "wrong ops token")
