"""What a chaos run found, as JSON (for tools) and Markdown (for docs/reliability.md)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from yrelay_tools.chaos.checker import DeliveryFigures
from yrelay_tools.chaos.nemesis import CATEGORY, Injected
from yrelay_tools.testing.checker import DeliveryViolation


@dataclass
class RunReport:
    command: str
    config: dict[str, Any]
    injected: list[Injected]
    delivery: DeliveryFigures
    #: Client counters summed over clients and incarnations (edits, update
    #: sends, resyncs, drift repairs, connections, crashes).
    clients: dict[str, int]
    #: Server event-log totals (resends, resyncs by reason, evictions).
    server: dict[str, int]
    converged: bool
    #: Seconds from the end of the last fault / of the editing phase to the
    #: moment every client and the server held the same content.
    converge_after_last_fault: float | None
    converge_after_edits: float | None
    seconds: float
    violation: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.problem() is None

    def problem(self) -> str | None:
        """Why the run failed, or None: an acked update lost, replicas that
        did not converge, a stuck entry, a stream GC could not fold."""
        delivery = self.delivery
        if self.violation is not None:
            return self.violation
        if not self.converged:
            return "the replicas did not converge after the faults stopped"
        counts = {
            "acked updates lost": delivery.lost,
            "stuck entries": delivery.stuck,
            "documents GC cannot fold": delivery.blocked,
            "entries left unfolded": delivery.unfolded,
        }
        wrong = [f"{name}: {count}" for name, count in counts.items() if count]
        return "; ".join(wrong) or None

    def verify(self) -> None:
        """Raise DeliveryViolation unless nothing acked was lost, everyone
        converged, nothing is stuck and every stream folded."""
        problem = self.problem()
        if problem is not None:
            raise DeliveryViolation(problem)

    def faults_by_category(self) -> dict[str, int]:
        return dict(Counter(CATEGORY[record.action.fault] for record in self.injected))

    def faults_by_kind(self) -> dict[str, int]:
        return dict(Counter(record.action.fault.value for record in self.injected))

    def to_json(self) -> str:
        data = asdict(self)
        data["injected"] = [
            {
                "fault": record.action.fault.value,
                "at": record.action.at,
                "started": round(record.started, 3),
                "ended": round(record.ended, 3),
                "seconds": record.action.seconds,
                "value": record.action.value,
                "detail": record.detail,
            }
            for record in self.injected
        ]
        data["faults"] = self.faults_by_kind()
        data["ok"] = self.ok
        return json.dumps(data, indent=2, default=str)

    def figures(self) -> dict[str, Any]:
        """The row of the per-fault table in docs/reliability.md."""
        delivery, clients, server = self.delivery, self.clients, self.server
        return {
            "faults injected": ", ".join(f"{kind} {count}" for kind, count in sorted(self.faults_by_kind().items()))
            or "none",
            "acked updates": delivery.acked_updates,
            "lost acked updates": delivery.lost,
            "stuck entries (stored, never applicable in full)": delivery.stuck,
            "streams folded into their snapshot after the last GC pass": (
                f"{delivery.folded_streams} of {self.config.get('docs', '?')}"
                f" ({delivery.unfolded} entries left, {delivery.blocked} blocked)"
            ),
            "lost by Redis / recovered from clients": f"{delivery.lost_from_redis} / {delivery.recovered}",
            "duplicates appended to streams": delivery.stream_duplicates,
            "resends answered from the dedup (duplicate: true)": server.get("append:duplicate", 0),
            "update resends (client)": clients.get("update_resends", 0),
            "delivery resends (server)": server.get("resend", 0),
            "resyncs (client)": clients.get("resyncs", 0),
            "resyncs by reason (server)": ", ".join(
                f"{key.split(':', 1)[1]} {value}" for key, value in sorted(server.items()) if key.startswith("resync:")
            )
            or "none",
            "drift repairs (client)": clients.get("drift_repairs", 0),
            "evictions": server.get("evict", 0),
            "clients without persistence": self.config.get("ephemeral_clients", 0),
            "client crashes (of clients without persistence)": (
                f"{clients.get('crashes', 0)} ({clients.get('ephemeral_crashes', 0)})"
            ),
            "refused: unavailable / missing_dependency (client)": (
                f"{clients.get('error:unavailable', 0)} / {clients.get('error:missing_dependency', 0)}"
            ),
            "converged": "yes" if self.converged else "NO",
            "time to converge after the last fault": _seconds(self.converge_after_last_fault),
            "time to converge after the last edit": _seconds(self.converge_after_edits),
        }

    def to_markdown(self) -> str:
        lines = [f"`{self.command}`", "", "| figure | value |", "| --- | --- |"]
        lines += [f"| {name} | {value} |" for name, value in self.figures().items()]
        if self.violation:
            lines += ["", f"**VIOLATION**: {self.violation}"]
        lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} s"
