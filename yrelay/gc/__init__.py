"""GC: fold acked entries into snapshots, trim streams, evict lagging sessions.

``Collector`` does the work for a batch of documents, ``schedule`` decides
which documents a pass looks at and runs the periodic loop, ``GcPolicy`` holds
the thresholds. The package is named ``yrelay.gc``; nothing here shadows the
standard library's ``gc``.
"""

from yrelay.gc.collector import Collector, DocReport, Step
from yrelay.gc.policy import GcPolicy
from yrelay.gc.schedule import DueSet, GcLoop, PassSummary, collect_documents, run_due_pass
from yrelay.storage.listing import all_documents

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
