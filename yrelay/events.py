"""Deprecated name of :mod:`yrelay.observability.events` (moved in issue 34), kept so a host
application that imports the old name, as the docs once showed, still runs;
it warns once and will be removed in a later release."""

import warnings

from yrelay.observability.events import *  # noqa: F403 - the old name re-exports the module's public names

warnings.warn("yrelay.events is deprecated: import yrelay.observability.events", DeprecationWarning, stacklevel=2)
