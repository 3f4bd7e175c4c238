"""A `yrelay consume` command, as a user would write it: store each batch's
entry ids, then ack it. Arguments: the output file, a marker file; while the
marker does not exist, it creates it and exits without acking its second
batch (a crash)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

out, marker = Path(sys.argv[1]), Path(sys.argv[2])
crash = not marker.exists()
marker.write_text(str(os.getpid()))
print("script started", flush=True)  # not an ack: passed through to stderr
for count, line in enumerate(sys.stdin, 1):
    batch = json.loads(line)
    with out.open("a") as f:
        f.write(json.dumps({"doc": batch["doc"], "ids": batch["ids"], "deleted": batch.get("deleted", False)}) + "\n")
    if crash and count == 2:
        sys.exit(3)
    print(f"ack {batch['delivery']}", flush=True)
