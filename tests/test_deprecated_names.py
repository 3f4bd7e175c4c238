"""The old import paths the docs once showed host applications (issue 34 moved
their modules) still give the same objects, and say they are deprecated."""

from __future__ import annotations

import importlib
import sys

import pytest

OLD_NAMES = [
    ("yrelay.redis_server", "serve_redis_url", "yrelay.storage.embedded"),
    ("yrelay.events", "Events", "yrelay.observability.events"),
    ("yrelay.eventlog", "EventLog", "yrelay.observability.eventlog"),
    ("yrelay.keys", "room_doc_id", "yrelay.storage.keys"),
]


@pytest.mark.parametrize(("old", "name", "new"), OLD_NAMES)
def test_an_old_import_path_warns_and_gives_the_moved_object(old: str, name: str, new: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
