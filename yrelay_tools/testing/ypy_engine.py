"""A pytest plugin that makes y-py the default engine: every document
``crdt.new_doc()`` makes and every :class:`~yrelay.client.YrelayClient`
holds is a ``y_py.YDoc``, so the client's tests run against the y-py engine
unchanged (tests/test_client_engines.py runs some of them so):

    python -m pytest -p yrelay_tools.testing.ypy_engine tests/test_ordered_sending.py

Needs the ``ypy`` extra.
"""

from __future__ import annotations

from yrelay.client import YrelayClient
from yrelay.yjs import crdt

crdt.check_engine(crdt.YPY)
crdt.new_doc.__defaults__ = (None, crdt.YPY)
crdt.merge_updates.__defaults__ = (None, crdt.YPY)
YrelayClient.__init__.__kwdefaults__["engine"] = crdt.YPY
