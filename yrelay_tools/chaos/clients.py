"""The harness's side of a chaos client: its OS process, its proxy and the
files it leaves (:mod:`yrelay_tools.chaos.workload`)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yrelay.storage.embedded import _die_with_parent
from yrelay_tools.chaos.proxy import FaultProxy
from yrelay_tools.chaos.workload import WorkloadConfig
from yrelay_tools.testing.processes import terminate


@dataclass(frozen=True)
class AckRecord:
    """One ``appended`` a client got, as it wrote it to ``acked.jsonl``."""

    client: str
    doc: str
    session: str
    clock: int
    id: str
    duplicate: bool
    update: bytes


class ClientProcess:
    def __init__(self, config: WorkloadConfig, proxy: FaultProxy):
        self.config = config
        self.proxy = proxy
        self.dir = Path(config.directory)
        self.process: subprocess.Popen[bytes] | None = None
        self.crashes = 0

    @property
    def name(self) -> str:
        return self.config.name

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        config_path = self.dir / "config.json"
        self.config.save(config_path)
        log = (self.dir / "client.log").open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "yrelay_tools.chaos.workload", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: whatever the client had not written to its state file is gone."""
        if self.running:
            assert self.process is not None
            self.process.kill()
            self.process.wait()
            self.crashes += 1

    def finish(self, timeout: float = 30.0) -> None:
        """SIGTERM: the client writes ``final.json`` and exits."""
        if self.process is not None:
            terminate(self.process, timeout)

    def status(self) -> dict[str, Any] | None:
        try:
            status: dict[str, Any] = json.loads((self.dir / "status.json").read_text())
            return status
        except (FileNotFoundError, ValueError):
            return None

    def final(self) -> dict[str, Any]:
        final: dict[str, Any] = json.loads((self.dir / "final.json").read_text())
        return final

    def acked(self) -> list[AckRecord]:
        """Every ack of every incarnation (a torn last line of a killed one is skipped)."""
        records: list[AckRecord] = []
        path = self.dir / "acked.jsonl"
        if not path.exists():
            return records
        for line in path.read_text().splitlines():
            try:
                raw = json.loads(line)
            except ValueError:
                continue
            records.append(
                AckRecord(
                    self.name,
                    raw["doc"],
                    raw["session"],
                    raw["clock"],
                    raw["id"],
                    raw["duplicate"],
                    base64.b64decode(raw["update"]),
                )
            )
        return records
