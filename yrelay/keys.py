"""Deprecated name of :mod:`yrelay.storage.keys` (moved in issue 34), kept so a host
application that imports the old name, as the docs once showed, still runs;
it warns once and will be removed in a later release."""

import warnings

from yrelay.storage.keys import *  # noqa: F403 - the old name re-exports the module's public names

warnings.warn("yrelay.keys is deprecated: import yrelay.storage.keys", DeprecationWarning, stacklevel=2)
