"""The public name of yrelay's Yjs engines (``from yrelay import crdt``);
they live in :mod:`yrelay.yjs.crdt`, beside the codec they build on."""

from yrelay.yjs.crdt import *  # noqa: F403 - the public name re-exports the engines' API
from yrelay.yjs.crdt import __all__ as __all__
