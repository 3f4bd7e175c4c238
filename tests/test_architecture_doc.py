"""docs/architecture.md's module table names every module of ``yrelay/``, and
nothing that is gone: the table is how a newcomer finds where an idea lives,
and a table that drifts from the tree misleads (issue 34)."""

from __future__ import annotations

import ast
import builtins
import importlib
import re
import sys
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


# ---------------------------------------------------------------- names
# Docs and docstrings name modules, classes and functions (``yrelay.app.core.
# connection``, :class:`.peer.Codec`, `yrelay/storage/reads.py`, `app/ticker.py`); code moves,
# and a name that resolves to nothing sends a reader looking for what is gone.
# Resolved from the source (ast), so no optional extra has to be installed.

ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc|obj):`~?([\w.]+)`")
DOTTED = re.compile(r"`{1,2}(yrelay(?:_tools)?(?:\.\w+)+)(?:\(\))?`")
FILE = re.compile(r"(?<![\w./-])((?:yrelay|yrelay_tools)/[\w/.*-]*?/|(?:[\w-]+/)+[\w*-]+\.(?:py|lua))(?![\w.-])")
#: Where a path in the docs may start: the repository, or the package the
#: text is about (``app/ticker.py``, ``core/services.py``, ``lua/append.lua``, ``examples/x.py``).
BASES = (ROOT, *(ROOT / "yrelay" / sub for sub in ("", "app", "storage")), ROOT / "yrelay_tools", ROOT / "docs")


class Module:
    """One module's names, as its source defines or imports them."""

    def __init__(self, name: str, path: Path):
        self.name = name
        tree = ast.parse(path.read_text())
        self.defined: dict[str, ast.AST] = {}
        self.imported: dict[str, str] = {}
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in statements(tree.body):
            if isinstance(node, ast.Import):
                self.imported.update({a.asname or a.name: a.name for a in node.names})
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
                self.imported.update({a.asname or a.name: f"{base}.{a.name}" for a in node.names})
            else:
                self.defined.update({target: node for target in bound(node)})
        #: Names a module-level ``__getattr__`` makes on demand (lazy and deprecated ones): those it spells out.
        lazy = "__getattr__" in self.defined
        self.lazy = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)} if lazy else set()


def statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """A module's statements, those under ``if TYPE_CHECKING:`` and ``try:`` included."""
    found = []
    for node in body:
        if isinstance(node, ast.If | ast.Try):
            nested = [*node.body, *node.orelse, *getattr(node, "finalbody", []), *getattr(node, "handlers", [])]
            found += statements([n for h in nested for n in (h.body if isinstance(h, ast.ExceptHandler) else [h])])
        else:
            found.append(node)
    return found


def bound(node: ast.AST) -> list[str]:
    """The names a statement of a module or class body binds."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def members(cls: ast.ClassDef) -> set[str]:
    """A class's attributes: its body's names and what its methods set on ``self``."""
    names = {name for node in cls.body for name in bound(node)}
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    slots = [node.value for node in cls.body if isinstance(node, ast.Assign) and "__slots__" in bound(node)]
    return names | {n.value for slot in slots for n in ast.walk(slot) if isinstance(n, ast.Constant)}


MODULES = {
    path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__"): path
    for package in ("yrelay", "yrelay_tools")
    for path in (ROOT / package).rglob("*.py")
    if "static" not in path.parts
}
_parsed: dict[str, Module] = {}


def module(name: str) -> Module:
    if name not in _parsed:
        _parsed[name] = Module(name, MODULES[name])
    return _parsed[name]


def resolves(dotted: str, depth: int = 0) -> bool:
    """Whether ``dotted`` names a module of the tree or something in one;
    a name imported from outside the tree is taken on trust."""
    parts = dotted.split(".")
    cut = next((i for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in MODULES), 0)
    if cut == 0:
        return parts[0] not in ("yrelay", "yrelay_tools")
    if cut == len(parts):
        return True
    owner, name, rest = module(".".join(parts[:cut])), parts[cut], parts[cut + 1 :]
    if name in owner.imported and depth < 8:
        return resolves(".".join([owner.imported[name], *rest]), depth + 1)
    if name not in owner.defined:
        return name in owner.lazy
    return attribute_of(owner, owner.defined[name], rest)


def attribute_of(owner: Module, node: ast.AST, rest: list[str]) -> bool:
    """Whether ``rest`` (``Class.method``) is on a class of ``owner``, or one of its bases of the tree."""
    if not rest or not isinstance(node, ast.ClassDef):
        return True  # an attribute of a function or a value is not checked
    if rest[0] in members(node):
        return attribute_of(owner, node, [])
    for base in node.bases:
        name = ast.unparse(base).split("[")[0]
        head, _, tail = name.partition(".")
        full = ".".join(filter(None, [owner.imported.get(head, head), tail]))  # as imported
        if name in owner.defined and owner.defined[name] is not node:
            if attribute_of(owner, owner.defined[name], rest):
                return True
        elif full.startswith(("yrelay.", "yrelay_tools.")):
            if resolves(".".join([full, *rest])):
                return True
        elif inherited(full, rest[0]):
            return True
    return False


def inherited(base: str, attribute: str) -> bool:
    """Whether a base from outside the tree has ``attribute``: looked up on the
    builtins and the standard library's classes, taken on trust from a third party."""
    home, _, name = base.rpartition(".")
    if home and home.split(".")[0] not in sys.stdlib_module_names:
        return True
    cls = getattr(importlib.import_module(home) if home else builtins, name, None)
    return isinstance(cls, type) and any(attribute in vars(k) for k in cls.__mro__)


def known(name: str, where: Module) -> bool:
    """A docstring role's target, as Sphinx finds it: ``.a.B`` is a suffix of
    a name anywhere; ``B`` is in the module, or anywhere in the tree."""
    if name.startswith("."):
        return any(resolves(f"{other}.{name.lstrip('.')}") for other in MODULES)
    head = name.split(".")[0]
    if head in ("yrelay", "yrelay_tools"):
        return resolves(name)
    if head in where.imported:
        return resolves(".".join([where.imported[head], *name.split(".")[1:]]))
    if head in where.defined:
        return resolves(f"{where.name}.{name}")
    if any(head in members(node) for node in where.defined.values() if isinstance(node, ast.ClassDef)):
        return True  # a method of the class the docstring is in
    homes = [other for other in MODULES if head in module(other).defined]
    if homes:
        return any(resolves(f"{other}.{name}") for other in homes)
    return head in dir(builtins) or "." in name  # else from outside the tree (``starlette.requests.Request``)


def strings_of_the_code() -> set[str]:
    """String constants of the package: ``yrelay.yws`` is a subprotocol, not a module."""
    return {
        node.value
        for path in MODULES.values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("yrelay")
    }


def file_exists(path: str) -> bool:
    path = path.rstrip("/")
    return any(any(base.glob(path)) if "*" in path else (base / path).exists() for base in BASES)


def unresolved() -> list[str]:
    """Every name of the docs and the package's docstrings that resolves to nothing, with where it is."""
    strings = strings_of_the_code()
    texts = {p.relative_to(ROOT).as_posix(): p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]}
    gone = []
    for name in sorted(n for n in MODULES if n.startswith("yrelay.")):
        where = module(name)
        source = MODULES[name].read_text()
        texts[MODULES[name].relative_to(ROOT).as_posix()] = source
        gone += [f"{name}: {role}" for role in ROLE.findall(source) if not known(role, where)]
    for place, text in texts.items():
        gone += [f"{place}: {n}" for n in DOTTED.findall(text) if n not in strings and not resolves(n)]
        gone += [f"{place}: {path}" for path in FILE.findall(text) if not file_exists(path)]
    return gone


def test_names_in_the_docs_and_docstrings_resolve():
    assert len(MODULES) > 150  # the tree was read
    assert unresolved() == [], "names that resolve to nothing (moved or renamed?)"
