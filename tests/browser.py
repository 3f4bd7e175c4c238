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
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WEB_DIR = REPO / "web"
STATIC_DIR = REPO / "yrelay" / "app" / "static"


def require_web_build() -> None:
    """The browser tests need `make web` (the README's test command runs it):
    fail with that instruction rather than with a blank page."""
    missing = [path for path in (WEB_DIR / "node_modules", STATIC_DIR / "demo.js") if not path.exists()]
    if missing:
        raise AssertionError(f"web client not built ({', '.join(map(str, missing))}): run `make web`")


async def run_node(
    *args: str, cwd: Path, env: dict[str, str], timeout: float, merge_stderr: bool = False
) -> tuple[int, str, str]:
    """Run node (the tests' JavaScript side) next to a server in this event
    loop; return its exit code, stdout and stderr. A node that outlives
    `timeout` is killed, never left behind."""
    process = await asyncio.create_subprocess_exec(
        "node",
        *args,
        cwd=cwd,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode, stdout.decode(), (stderr or b"").decode()


def tap_failures(report: str, limit: int = 8000) -> str:
    """The failed subtests of a ``node --test --test-reporter=tap`` report,
    each with its diagnostics block, then the report's closing counts.

    An assertion message showing the report's tail only showed the subtests
    that passed after the one that failed (the first failure on a busy
    machine could not be read back from the CI log)."""
    lines = report.splitlines()
    failed: list[str] = []
    for index, line in enumerate(lines):
        if line.lstrip().startswith("not ok"):
            block = [line]
            for following in lines[index + 1 :]:
                block.append(following)
                if following.strip() == "...":
                    break
            failed.append("\n".join(block))
    counts = [
        line
        for line in lines
        if line.startswith("# ")
        and line.split()[1:2]
        and line.split()[1] in {"tests", "pass", "fail", "cancelled", "skipped", "todo", "duration_ms"}
    ]
    text = "\n\n".join(failed) if failed else "(no `not ok` line: the tail of the report)\n" + report[-3000:]
    return (text[:limit] + "\n" + "\n".join(counts)).strip()
