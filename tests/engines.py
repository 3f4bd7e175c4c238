"""The mark of the tests that need the y-py engine.

y-py 0.6.2 is archived and has no wheels past CPython 3.12, so the ``ypy``
extra cannot be installed there and those tests cannot run (the 3.13 smoke,
.ci/py313-smoke, says how many it skipped). On CPython 3.11 and 3.12 the
``test`` extra installs y-py, and they must run: a missing y-py there fails
them (``crdt.EngineMissing``) instead of skipping them."""

from __future__ import annotations

import sys

import pytest

from yrelay.yjs import crdt

needs_ypy = pytest.mark.skipif(
    sys.version_info >= (3, 13) and not crdt.ypy_available(),
    reason="y-py 0.6.2 (archived) cannot be installed on CPython 3.13+; these tests run on 3.11-3.12",
)
