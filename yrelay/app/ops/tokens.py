"""``POST /ops/tokens/revoke``: a client token refused on every server
process from now on (:mod:`yrelay.auth.revocation`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Response, status
from pydantic import BaseModel, ConfigDict, Field

from yrelay.app.binding import RelayRevocations
from yrelay.app.http_body import documented, json_body
from yrelay.auth import AlreadyExpired

router = APIRouter()


class RevokeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422, not ignored

    jti: str = Field(..., min_length=1, max_length=200, description="The token id (JWT 'jti') to revoke.")
    expires_at: float | None = Field(
        None,
        allow_inf_nan=False,
        description="The token's exp (Unix seconds); the revocation is kept until "
        "then plus auth_leeway. 422 when that has passed already.",
    )


@router.post("/tokens/revoke", status_code=status.HTTP_204_NO_CONTENT, openapi_extra=documented(RevokeRequest))
async def revoke_token(
    body: Annotated[RevokeRequest, Depends(json_body(RevokeRequest))], revocations: RelayRevocations
) -> Response:
    """Revoke a client token on every server process: its connections are
    closed with code 4401 within ``revocation_refresh`` + ``resend_check_interval`` seconds, and it is
    refused from then on."""
    try:
        await revocations.revoke(body.jti, body.expires_at)
    except AlreadyExpired as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    return Response(status_code=status.HTTP_204_NO_CONTENT)
