"""A FastAPI product with its own users, and collaborative editing added by
mounting yrelay under ``/collab`` (docs/embedding.md walks through it).

Run it beside ``make serve`` (it uses that server's Redis, and port 8001)::

    python docs/examples/embed_fastapi.py

or with a Redis of your own (the ops token is optional)::

    YRELAY_REDIS_URL=redis://localhost:6379/0 YRELAY_PORT=8001 YRELAY_OPS_TOKEN=ops-secret \\
        python docs/examples/embed_fastapi.py

Then ``POST /login`` with ``{"name": "ada"}`` sets the session cookie; a
browser on the same origin opens ``ws://127.0.0.1:8001/collab/ws`` with it.
A script sends the user's API key instead, as the ``token`` of ``hello``.
tests/test_embedding.py runs this very file.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Response
from pydantic import BaseModel
from starlette.requests import HTTPConnection

from yrelay import Relay
from yrelay.auth import Principal
from yrelay.config import Settings
from yrelay.storage.embedded import serve_redis_url


# ---------------------------------------------------------------- the host's own users


@dataclass(frozen=True)
class User:
    name: str
    team: str
    editor: bool  # may change documents, or only read them
    api_key: str


#: The host's user store (a database in a real product).
USERS = {
    "ada": User("ada", team="research", editor=True, api_key="key-ada"),
    "bob": User("bob", team="research", editor=False, api_key="key-bob"),
}
#: Session id -> user name, set by /login (a session table or a signed cookie in a real product).
SESSIONS: dict[str, str] = {}


def user_of(connection: HTTPConnection, api_key: str | None = None) -> User:
    """The host's one check, for its HTTP routes and for yrelay alike: the
    session cookie, else an API key (an ``Authorization: Bearer`` header, or
    the token a websocket client sends in ``hello``)."""
    name = SESSIONS.get(connection.cookies.get("session", ""))
    if name is None:
        header = connection.headers.get("authorization", "")
        key = api_key or (header[7:] if header.lower().startswith("bearer ") else None)
        name = next((user.name for user in USERS.values() if key and secrets.compare_digest(user.api_key, key)), None)
    if name is None:
        raise HTTPException(401, "log in first")
    return USERS[name]


def current_user(connection: HTTPConnection) -> User:
    """The FastAPI dependency of the host's routes (a Request is an HTTPConnection)."""
    return user_of(connection)


# ---------------------------------------------------------------- yrelay, with the host's auth


async def authenticate(connection: HTTPConnection, token: str | None) -> Principal:
    """The host's user -> which documents they may open, and how. Raising
    HTTPException(401) (from user_of) refuses the connection: the client gets
    an ``unauthorized`` error frame and close code 4401."""
    user = user_of(connection, api_key=token)
    return Principal.of(user.name, [f"{user.team}/*"], "write" if user.editor else "read")


#: YRELAY_* settings; the Redis is YRELAY_REDIS_URL, else the one `make serve` runs in this
#: checkout; the port 8001 unless YRELAY_PORT says (`make serve` has 8000).
settings = Settings.from_env(port=int(os.environ.get("YRELAY_PORT", 8001)),
                             redis_url=os.environ.get("YRELAY_REDIS_URL") or serve_redis_url() or "redis://localhost:6379/0")
relay = Relay(settings, authenticate=authenticate)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # ... the host's own start-up (database pool, ...) ...
    async with relay.lifespan():
        yield


app = FastAPI(title="notes", lifespan=lifespan)
# app.include_router(relay.router, prefix="/collab") plus the websocket taken before FastAPI's routing:
# /collab/ws, /collab/ops/..., /collab/metrics, /collab/healthz, /collab/readyz
relay.install(app, prefix="/collab")


# ---------------------------------------------------------------- the host's own routes


class Login(BaseModel):
    name: str


@app.post("/login")
async def login(body: Login, response: Response) -> dict[str, str]:
    """A stand-in for a real login: any known name gets a session cookie."""
    if body.name not in USERS:
        raise HTTPException(401, "unknown user")
    session = secrets.token_urlsafe(16)
    SESSIONS[session] = body.name
    response.set_cookie("session", session, httponly=True, samesite="lax")
    return {"user": body.name}


@app.get("/me")
async def me(user: Annotated[User, Depends(current_user)]) -> dict[str, object]:
    """Who is logged in, and the documents their editor may open."""
    return {"user": user.name, "documents": f"{user.team}/*", "editor": user.editor}


if __name__ == "__main__":
    import sys

    import redis
    import uvicorn

    try:  # one plain line when Redis is not there (uvicorn would print the start-up's traceback)
        redis.Redis.from_url(relay.redis_url, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        sys.exit(f"notes: Redis did not answer ({exc}): run `make serve` in this checkout "
                 "(this app uses its Redis), or set YRELAY_REDIS_URL")
    print(f"notes: serving http://{settings.host}:{settings.port} (POST /login, GET /me; yrelay under /collab: "
          f"ws://{settings.host}:{settings.port}/collab/ws); Ctrl-C to stop", flush=True)
    # yrelay's uvicorn options: the websocket message cap (compression bombs),
    # keep-alive pings, the request-head deadline (docs/security.md).
    uvicorn.run(app, host=settings.host, port=settings.port, **settings.uvicorn_options())  # type: ignore[arg-type]
