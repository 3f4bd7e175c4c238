"""Request bodies of the relay's HTTP routes: read after the token check,
never past a cap.

FastAPI reads and validates a route's declared body (a pydantic parameter)
before it runs any of the route's dependencies, the token checks included:
``POST /ops/gc`` without a token read a 128 MiB body into memory (RSS +384
MiB) to answer 401, and answered a malformed one 422 (issue 30). So no route
of the relay declares a body. The two that take one (``POST /ops/gc``,
``POST /ops/tokens/revoke``) get it from :func:`json_body`, a dependency
that runs after the router's (the relay binding, then the token check) and
streams the body, refusing it with 413 once it passes ``cap`` bytes (at once
when ``Content-Length`` announces more): at most ``cap`` bytes and one chunk
are ever held. Every other route never reads a body, so whatever a client
sends there is left to uvicorn, which stops reading at 64 KiB until the
answer is sent and then discards the rest (tests/test_http_auth.py).

A dependency rather than middleware, so the order holds however a host
includes the relay's router (``Relay.install`` or its own ``include_router``
under any prefix, with any FastAPI release): the token check comes first
because it is a dependency of the router, and the body is a dependency of
the route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

#: Largest body an ``/ops`` route reads (theirs are a few hundred bytes).
MAX_BODY_BYTES = 64 * 1024

Model = TypeVar("Model", bound=BaseModel)


def json_body(model: type[Model], cap: int = MAX_BODY_BYTES) -> Callable[[Request], Awaitable[Model]]:
    """The dependency that reads the request's body (at most ``cap`` bytes)
    as JSON and validates it as ``model``: 413 past the cap, 422 for what
    ``model`` refuses (FastAPI's own answer for a declared body)."""

    async def read_body(request: Request) -> Model:
        try:
            return model.model_validate_json(await _capped(request, cap))
        except ValidationError as exc:
            errors = [
                {**error, "loc": ("body", *error["loc"]), "input": _echoable(error.get("input"))}
                for error in exc.errors(include_url=False)
            ]
            raise RequestValidationError(errors) from None

    return read_body


def _echoable(value: Any) -> Any:
    """What a refused body is echoed as in the 422 answer: the raw bytes of
    a body that is not JSON, as text. FastAPI encodes bytes as UTF-8 text
    and raised on any other: a body that was not UTF-8 (``b"\\xff"``) was
    answered 500, with a traceback in the log (issue 36)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def documented(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads ``model`` with :func:`json_body`:
    the request body it would have shown had it been declared."""
    schema = {"schema": model.model_json_schema()}
    return {"requestBody": {"required": True, "content": {"application/json": schema}}}


async def _capped(request: Request, cap: int) -> bytes:
    announced = request.headers.get("content-length", "")
    if announced.isdigit() and int(announced) > cap:
        raise _too_large(cap)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > cap:
            raise _too_large(cap)
    return bytes(body)


def _too_large(cap: int) -> HTTPException:
    return HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"request body over {cap} bytes")
