"""The ``yrelay`` command line: thin over library functions."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer
import uvicorn

from .app import create_app
from .config import Settings
from .redis_server import RedisProcess

cli = typer.Typer(help="yrelay: reliable Yjs sync over Redis streams.", no_args_is_help=True)


@cli.callback()
def main() -> None:
    """yrelay command line."""


@cli.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
    redis_url: Optional[str] = typer.Option(
        None, envvar="YRELAY_REDIS_URL", help="Redis to use. Without it an embedded redis-server is started."
    ),
    data_dir: Path = typer.Option(Path("data"), envvar="YRELAY_DATA_DIR", help="Embedded Redis data (AOF)."),
    log_level: str = typer.Option("info", help="debug, info, warning or error."),
) -> None:
    """Serve the websocket endpoint at /ws (and /healthz, /readyz)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env(host=host, port=port, redis_url=redis_url, data_dir=data_dir)
    embedded: RedisProcess | None = None
    url = settings.redis_url
    if url is None:
        embedded = RedisProcess(settings.data_dir / "redis").start()
        url = embedded.url
        logging.getLogger("yrelay").info(
            "embedded redis-server on %s (appendonly yes, appendfsync always, data in %s)", url, embedded.data_dir
        )
    try:
        uvicorn.run(
            create_app(settings, url),
            host=settings.host,
            port=settings.port,
            log_level=log_level,
            ws_max_size=settings.max_frame_bytes * 4,  # larger frames are answered with an error frame
            ws_ping_interval=20,
            ws_ping_timeout=20,
        )
    finally:
        if embedded is not None:
            embedded.stop()


if __name__ == "__main__":
    cli()
