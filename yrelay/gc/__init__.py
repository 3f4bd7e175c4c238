"""GC: fold acked entries into snapshots, trim streams, evict lagging sessions.

``Collector`` does the work for a batch of documents, ``schedule`` decides
which documents a pass looks at and runs the periodic loop, ``GcPolicy`` holds
the thresholds. The package is named ``yrelay.gc``; nothing here shadows the
standard library's ``gc``.
"""

from ..listing import all_documents
from .collector import Collector, DocReport, Step
from .policy import GcPolicy
from .schedule import DueSet, GcLoop, PassSummary, collect_documents, run_due_pass

__all__ = [
    "Collector",
    "DocReport",
    "DueSet",
    "GcLoop",
    "GcPolicy",
    "PassSummary",
    "Step",
    "all_documents",
    "collect_documents",
    "run_due_pass",
]
