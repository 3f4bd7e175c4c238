"""docs/architecture.md's "The path of one update" is the path the code
takes (issue 35): every function its steps name exists, the steps cross at
most 15 modules, and one update driven through a live server leaves its
traces in the documented order.

Everything is read from the doc: its numbered steps, the fully qualified
names in them, each step's ``(trace: ...)`` and the steps the writer's
answer runs ``alongside``. A restructuring that moves a function updates
the doc's name and this test follows; a name left behind fails here.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from redis.asyncio import Redis

from conftest import running_server
from test_eventlog import read_events
from test_subscription_set import eventually_async
from test_validation import good_update
from wsraw import RawPeer
from yrelay.storage.offsets import StreamId
from yrelay.tracker import Tracker

ROOT = Path(__file__).resolve().parent.parent
HEADING = "## The path of one update"
MAX_MODULES = 15
#: A backticked dotted name (``a.b``); in a step each must be a yrelay name,
#: so that every one of them is resolved here.
DOTTED = re.compile(r"`(\w+(?:\.\w+)+)`")
STEP = re.compile(r"^(\d+)\. `(yrelay(?:\.\w+)+)`")
TRACE = re.compile(r"\(trace: (?:event `(\w+)`|(tracker) offset)\)")
ALONGSIDE = re.compile(r"alongside steps (\d+)[–-](\d+)")
#: What one update on /ws must leave, in the doc's words (the issue's path).
TRACES = {"append", "deliver", "ack", "tracker"}
TRACKER = "tracker"


@dataclass(frozen=True)
class Step:
    number: int
    text: str
    #: Every name the step gives, the step's own function first.
    names: list[str]
    #: An event type, ``tracker``, or None: what the step leaves to see.
    trace: str | None
    #: The steps this one is not ordered with.
    alongside: frozenset[int]


def documented_steps() -> list[Step]:
    """The numbered list of the section, each item with its indented lines."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert HEADING in text, f"docs/architecture.md has no section {HEADING!r}"
    section = text.split(HEADING + "\n", 1)[1].split("\n## ", 1)[0]
    items: list[str] = []
    for line in section.splitlines():
        if re.match(r"^\d+\. ", line):
            items.append(line)
        elif items and line.startswith("   ") and line.strip():
            items[-1] += " " + line.strip()
        elif items and line.strip():
            break  # the list ended
    steps = []
    for item in items:
        match = STEP.match(item)
        assert match, f"a step begins with the fully qualified name of its function: {item[:80]!r}"
        names = DOTTED.findall(item)
        short = [name for name in names if not name.startswith("yrelay.")]
        assert not short, f"step {match[1]} names {short}: write them from yrelay. on, so that they are checked"
        traces = TRACE.findall(item)
        assert len(traces) <= 1, f"step {match[1]} leaves at most one trace: {traces}"
        trace = next((event or tracker for event, tracker in traces), None)
        spans = [range(int(a), int(b) + 1) for a, b in ALONGSIDE.findall(item)]
        steps.append(Step(int(match[1]), item, names, trace, frozenset(n for span in spans for n in span)))
    return steps


def resolve(name: str) -> tuple[ModuleType, object]:
    """The module of ``name`` (its longest importable prefix) and what it names there."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                continue  # not a module: a shorter prefix may be
            raise
        target: object = module
        for attribute in parts[cut:]:
            target = getattr(target, attribute, None)
            assert target is not None, f"{name}: {module_name} has no {'.'.join(parts[cut:])}"
        return module, target
    raise AssertionError(f"{name}: no module of it can be imported")


def test_every_name_in_the_steps_exists_and_they_cross_at_most_15_modules() -> None:
    steps = documented_steps()
    assert [step.number for step in steps] == list(range(1, len(steps) + 1)), "steps are numbered 1, 2, 3..."
    modules = set()
    for step in steps:
        for name in step.names:
            module, target = resolve(name)
            assert callable(target), f"step {step.number}: {name} is not a function"
            modules.add(module.__name__)
    assert len(steps) >= 5 and len(modules) >= 5  # the section was read
    assert len(modules) <= MAX_MODULES, f"the path crosses {len(modules)} modules: {sorted(modules)}"
    traced = [step.trace for step in steps if step.trace is not None]
    assert sorted(traced) == sorted(TRACES), f"the steps' traces {traced}, one of each of {sorted(TRACES)}"


def out_of_order(steps: list[Step], seen: dict[str, int]) -> list[str]:
    """The pairs of traced steps whose traces were seen in the other order
    (``seen``: each trace's position), but for steps run alongside each other."""
    traced = [(step, step.trace) for step in steps if step.trace is not None]
    wrong = []
    for i, (before, first) in enumerate(traced):
        for after, then in traced[i + 1 :]:
            unordered = after.number in before.alongside or before.number in after.alongside
            if not unordered and seen[first] > seen[then]:
                wrong.append(f"step {before.number} ({first}) after step {after.number} ({then})")
    return wrong


async def test_one_update_leaves_the_traces_of_its_steps_in_the_documented_order(
    redis_url: str, redis_client: Redis, tmp_path: Path
) -> None:
    """A writer and a reader on /ws, one update, the reader's deliver and ack:
    each traced step's event is found once in the event log, naming that
    update's entry, in the order of the steps (by log position), and the
    tracker holds the entry for the reader only after its ack. Waits are
    on conditions; resends are off, so nothing is delivered twice."""
    steps = documented_steps()
    doc = "one-update"
    tracker = Tracker(redis_client)
    async with running_server(redis_url, gc_interval=0, data_dir=tmp_path, resend_after=600) as url:
        writer, reader = await RawPeer.connect(url), await RawPeer.connect(url)
        for peer in (reader, writer):  # the writer too: /ws takes updates only of documents subscribed to
            await peer.send({"op": "subscribe", "doc": doc})
            await peer.expect("subscribed", timeout=30)
        answer = await writer.update(doc, 0, good_update())
        assert answer["op"] == "appended", answer
        delivered = await reader.expect("deliver", timeout=30)
        [entry] = delivered["entries"]
        entry_id = entry["id"]
        assert entry_id == answer["id"]
        session = reader.session
        assert session is not None
        held = await tracker.offset(doc, session)
        assert held is not None and held < StreamId.parse(entry_id), "the tracker moved before the ack"
        await reader.send({"op": "ack", "doc": doc, "offset": entry_id})
        await eventually_async(lambda: tracker.offset(doc, session), StreamId.parse(entry_id), timeout=30)
        await writer.close()
        await reader.close()
    # The server stopped: its event log is written out.
    sessions = {"append": writer.session, "deliver": reader.session, "ack": reader.session}
    lines = [line for line in read_events(tmp_path / "events") if line["doc"] == doc and line["type"] in sessions]
    seen: dict[str, int] = {}
    for position, line in enumerate(lines):
        assert line["type"] not in seen, f"{line['type']} logged twice: {lines}"
        assert line["session"] == sessions[line["type"]], line
        assert entry_id in (line.get("offset"), line.get("first")), f"{line} does not name {entry_id}"
        seen[line["type"]] = position
    assert set(seen) == set(sessions), f"logged: {[line['type'] for line in lines]}"
    seen[TRACKER] = len(lines)  # it held the entry only after the ack frame, which the ack event answers
    wrong = out_of_order(steps, seen)
    documented = [f"{step.number}: {step.trace}" for step in steps if step.trace is not None]
    assert not wrong, f"documented {documented}, logged {[line['type'] for line in lines]}: {wrong}"
