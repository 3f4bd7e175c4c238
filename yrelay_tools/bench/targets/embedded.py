"""yrelay embedded in a host's FastAPI app (docs/embedding.md), under uvicorn:
the bench's ``yrelay-embedded`` target. Issue 20 asks that the goals hold
for the embedded router as for ``yrelay serve``; this is the smallest host
that embeds it the documented way (``relay.install`` and ``relay.lifespan``).

Takes ``yrelay serve``'s command line (``serve --port P --redis-url U
--log-level L``), so the harness's :class:`ServerProcess` starts it."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI

from yrelay import Relay
from yrelay.config import Settings


def host_app(relay: Relay) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with relay.lifespan():
            yield

    app = FastAPI(lifespan=lifespan)
    relay.install(app)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()
    relay = Relay(Settings.from_env(), redis_url=args.redis_url)
    # uvicorn.run types each keyword; the options come as one dict[str, object] (yrelay.config)
    options = relay.settings.uvicorn_options()
    uvicorn.run(host_app(relay), host="127.0.0.1", port=args.port, log_level=args.log_level, **options)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
