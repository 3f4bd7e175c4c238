"""Headless Chromium for the browser tests: Debian's chromium driven by
Playwright (it never downloads a browser of its own), started with the flags
this machine's closed network needs, on a fresh profile every launch."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
WEB_DIR = REPO / "web"
STATIC_DIR = REPO / "yrelay" / "app" / "static"


def require_web_build() -> None:
    """The browser tests need `make web` (the README's test command runs it):
    fail with that instruction rather than with a blank page."""
    missing = [path for path in (WEB_DIR / "node_modules", STATIC_DIR / "demo.js") if not path.exists()]
    if missing:
        raise AssertionError(f"web client not built ({', '.join(map(str, missing))}): run `make web`")


async def run_node(*args: str, cwd: Path, env: dict[str, str], timeout: float,
                   merge_stderr: bool = False) -> tuple[int, str, str]:
    """Run node (the tests' JavaScript side) next to a server in this event
    loop; return its exit code, stdout and stderr. A node that outlives
    `timeout` is killed, never left behind."""
    process = await asyncio.create_subprocess_exec(
        "node", *args, cwd=cwd, env={**os.environ, **env}, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode, stdout.decode(), (stderr or b"").decode()
