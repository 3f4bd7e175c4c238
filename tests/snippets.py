"""The code blocks of the documentation, classified (issue 38: snippets are
tests). tests/test_snippets.py runs the runnable ones against a live server.

Every fenced block of README.md, web/README.md and docs/*.md, and every
file of docs/examples/, is one of:

- **runnable**: ``python`` (run with this venv's Python), ``js`` (run in
  Node, with the ``ws`` package as the global ``WebSocket``, as a page's
  code would run in a browser) or ``html`` (opened in headless Chromium from
  another origin than the server's). It is a complete file: imports, names
  defined, ``asyncio.run``. It talks to ``make serve``'s server,
  ``127.0.0.1:8000``, which the runner replaces with the live test server's
  address; a Redis comes from ``YRELAY_REDIS_URL``;
- a **fragment**: a block of one of those languages whose first line is a
  comment ``fragment: <why>`` (``# fragment:``, ``// fragment:``,
  ``<!-- fragment: ... -->``): shown, not run, and the reason is visible;
- **shell**: ``sh``/``bash``/``console``: commands a reader types; checked
  with ``bash -n`` (``sh``/``bash``), never run;
- **data**: config files, payloads, output and diagrams (``json`` is
  parsed, ``yaml`` loaded; ``text``, ``http``, ``toml``, ``ini`` shown).

Anything else (a fence without a language, an unknown language, an
indented code block, a fragment marker without a reason) is unclassified,
and the test fails naming the file and line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parent.parent

#: Language tag -> where a runnable block runs.
RUNTIMES = {"python": "python", "py": "python", "js": "node", "javascript": "node", "mjs": "node", "html": "browser"}
SHELL = {"sh", "bash", "shell", "console"}
DATA = {"json", "yaml", "yml", "toml", "ini", "text", "http"}
#: The comment a fragment's first line starts with, per runtime.
FRAGMENT = {
    "python": re.compile(r"#\s*fragment:\s*\S"),
    "node": re.compile(r"//\s*fragment:\s*\S"),
    "browser": re.compile(r"<!--\s*fragment:\s*\S.*-->"),
}


@dataclass(frozen=True)
class Block:
    """One code block: where it is, its language and text, and its kind
    (``run``, ``fragment``, ``shell``, ``data``, or ``unclassified``)."""

    path: Path
    line: int  # 1-based line of the opening fence (1 for a whole example file)
    lang: str
    text: str
    kind: str
    why: str = ""  # what is wrong with an unclassified block

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def runtime(self) -> str:
        return RUNTIMES.get(self.lang, "")


def documents() -> list[Path]:
    """The documents whose blocks a reader may paste."""
    return [REPO / "README.md", REPO / "web" / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def examples() -> list[Path]:
    return sorted(path for path in (REPO / "docs" / "examples").iterdir() if path.is_file())


def classify(path: Path, line: int, lang: str, text: str) -> Block:
    if lang in RUNTIMES:
        first = text.lstrip("\n").split("\n", 1)[0].strip()
        if "fragment:" in first:
            if FRAGMENT[RUNTIMES[lang]].match(first):
                return Block(path, line, lang, text, "fragment")
            return Block(
                path,
                line,
                lang,
                text,
                "unclassified",
                f"a fragment marker needs its language's comment and a reason: {first!r}",
            )
        return Block(path, line, lang, text, "run")
    if lang in SHELL:
        return Block(path, line, lang, text, "shell")
    if lang in DATA:
        return Block(path, line, lang, text, "data")
    why = "a fence without a language" if not lang else f"unknown language {lang!r}"
    return Block(path, line, lang, text, "unclassified", why + " (tests/snippets.py lists the known ones)")


def blocks_of(path: Path) -> list[Block]:
    found = []
    for token in MarkdownIt("commonmark").parse(path.read_text()):
        if token.type == "fence":
            lang = token.info.strip().split(" ")[0].lower() if token.info else ""
            found.append(classify(path, token.map[0] + 1, lang, token.content))  # type: ignore[index]
        elif token.type == "code_block":
            found.append(
                Block(
                    path,
                    token.map[0] + 1,
                    "",
                    token.content,
                    "unclassified",  # type: ignore[index]
                    "an indented code block: fence it with a language",
                )
            )
    return found


def all_blocks() -> list[Block]:
    found = [block for path in documents() for block in blocks_of(path)]
    for path in examples():
        lang = {".py": "python", ".js": "js", ".mjs": "js", ".html": "html"}.get(path.suffix, path.suffix)
        found.append(classify(path, 1, lang, path.read_text()))
    return found


def counts(blocks: list[Block]) -> dict[str, int]:
    return {
        kind: sum(block.kind == kind for block in blocks)
        for kind in ("run", "fragment", "shell", "data", "unclassified")
    }
