"""The reference tables of the docs name what the code has, and all of it:
docs/operations.md's settings (with their defaults) and metrics,
docs/protocol.md's frames, error codes and features. An operator sets what
the table lists and alerts on the names it shows; a table that drifts from
the code sends them to a variable that is read by nothing, or hides one
that is."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from yrelay.app.metrics import Metrics, ServerFigures
from yrelay.config import Settings
from yrelay.protocol import FEATURES, ErrorCode, Op

DOCS = Path(__file__).resolve().parent.parent / "docs"
#: Variables in the tables that are not settings: ``yrelay serve``'s own option.
CLI_ONLY = {"log_format"}
#: Words a default cell may say instead of a value.
NO_VALUE = {"unset", "none", "embedded"}
SWITCH = {"on": True, "off": False}
UNITS = {"MiB": 1024 * 1024, "s": 1}


def rows(doc: str, first: str) -> list[list[str]]:
    """The cells of every table row of ``doc`` whose first cell starts with ``first``."""
    lines = (DOCS / doc).read_text().splitlines()
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines if line.startswith(first)]


def section(doc: str, heading: str) -> str:
    return (DOCS / doc).read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def first_cells(text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^\| `(\w+)`", text, re.MULTILINE)}


def documented_settings() -> dict[str, str]:
    """Each ``YRELAY_*`` variable of operations.md's tables and the default its row gives it."""
    documented = {}
    for name_cell, default_cell, *_ in rows("operations.md", "| `YRELAY_"):
        names = [name.lower() for name in re.findall(r"`YRELAY_(\w+)`", name_cell)]
        values = re.findall(r"`([^`]+)`", default_cell) or [word.strip() for word in default_cell.split(",")]
        if len(values) == 1:
            values *= len(names)
        assert len(values) == len(names), f"{name_cell}: cannot pair its defaults {default_cell!r}"
        documented.update(zip(names, values, strict=True))
    return documented


def same(shown: str, value: object) -> bool:
    """Whether a default as the docs show it is ``value``."""
    if shown in NO_VALUE or value is None:
        return shown in NO_VALUE or value is None or shown.startswith("http")  # public_url: derived by serve
    if isinstance(value, bool):
        return SWITCH.get(shown, shown in ("1", "true")) is value
    if isinstance(value, tuple):
        return shown == ",".join(value)
    if isinstance(value, int | float):
        number, _, unit = shown.partition(" ")
        return float(number) * UNITS.get(unit, 1) == value
    return shown == str(value)


def test_every_setting_is_in_the_operations_tables_with_its_default():
    documented = documented_settings()
    settings = Settings()
    names = {item.name for item in fields(Settings)}
    assert len(documented) > 80  # the tables were read
    assert names - set(documented) == set(), "settings docs/operations.md does not list"
    assert set(documented) - names - CLI_ONLY == set(), "variables docs/operations.md lists that nothing reads"
    wrong = {
        name: (shown, getattr(settings, name))
        for name, shown in documented.items()
        if name in names and not same(shown, getattr(settings, name))
    }
    assert wrong == {}, "defaults in docs/operations.md that are not the code's (shown, code)"


class Idle:
    """A server with nothing on it, so the scrape-time families are collected too."""

    def scrape_figures(self) -> ServerFigures:
        return ServerFigures(**{item.name: 0 for item in fields(ServerFigures)})


def test_the_metrics_table_names_every_metric_and_nothing_else():
    metrics = Metrics(process_metrics=False)
    metrics.watch(Idle())
    exported = {family.name + ("_total" if family.type == "counter" else "") for family in metrics.registry.collect()}
    documented = set()
    for cell, *_ in rows("operations.md", "| `yrelay_"):
        first, *more = re.findall(r"`(\w+)`", cell)  # more: `_takeovers_total` after its group's first name
        documented |= {first, *(prefix(first) + suffix for suffix in more)}
    assert len(exported) > 40  # the registry was read
    assert exported - documented == set(), "metrics docs/operations.md#metrics does not list"
    assert documented - exported == set(), "metrics docs/operations.md#metrics lists that are not exported"


def prefix(first: str) -> str:
    """The family a row's further names hang off: ``yrelay_webhook`` of ``yrelay_webhook_delivered_total``."""
    return re.match(r"yrelay_(?:consumer_group|webhook)", first).group(0)  # type: ignore[union-attr]


def test_the_protocol_tables_are_the_frame_model():
    frames = set.union(*(first_cells(section("protocol.md", side)) for side in ("Client → server", "Server → client")))
    assert frames == {op.value for op in Op}, "docs/protocol.md's frame tables against protocol.Op"
    codes = first_cells(section("protocol.md", "Error codes"))
    assert codes == {code.value for code in ErrorCode}, "docs/protocol.md#error-codes against protocol.ErrorCode"
    features = first_cells(section("protocol.md", "Features").split("\n### ", 1)[0])
    assert features == set(FEATURES), "docs/protocol.md#features against protocol.FEATURES"
