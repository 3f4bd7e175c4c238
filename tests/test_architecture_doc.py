"""docs/architecture.md's module table names every module of ``yrelay/``, and
nothing that is gone: the table is how a newcomer finds where an idea lives,
and a table that drifts from the tree misleads (issue 34)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATH = re.compile(r"`(yrelay(?:_tools)?/[\w/.-]*)`")


def module_rows() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def named(module: Path, rows: list[str]) -> bool:
    """``module`` is in a row by its path, or by its file name in the row of its package (``yrelay/gc/``)."""
    path = module.relative_to(ROOT).as_posix()
    package = module.parent.relative_to(ROOT).as_posix() + "/"
    for row in rows:
        paths = PATH.findall(row)
        if path in paths or (package in paths and re.search(rf"`{re.escape(module.name)}`", row)):
            return True
    return False


def test_every_module_of_the_package_is_in_the_table():
    rows = module_rows()
    modules = [
        p for p in sorted((ROOT / "yrelay").rglob("*.py")) if p.name != "__init__.py" and "static" not in p.parts
    ]
    missing = [m.relative_to(ROOT).as_posix() for m in modules if not named(m, rows)]
    assert len(modules) > 100  # the tree was read
    assert missing == [], f"docs/architecture.md's module table does not name: {missing}"


def test_every_path_in_the_table_exists():
    gone = [path for row in module_rows() for path in PATH.findall(row) if not (ROOT / path.rstrip("/")).exists()]
    assert gone == [], f"docs/architecture.md's module table names what is not in the tree: {gone}"
