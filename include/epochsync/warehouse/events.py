"""A target's event log: committed epochs, failed runs and rollbacks, for ``status``.

One JSON Lines file per target in the warehouse (``events/target=T.jsonl``), appended
by the pipeline and the Airflow failure callback. It is history for operators, never
state: the manifest alone says where a replica is.
"""

from __future__ import annotations

import json
import os
import time

from epochsync.warehouse.paths import Warehouse, local_path

COMMITTED, FAILED, ROLLED_BACK = "committed", "failed", "rolled_back"


def record_event(warehouse: str, target: str, event: str, epoch: int | None, **details) -> dict:
    """Append one event (durable before returning); returns it."""
    doc = {"at": time.time(), "target": target, "event": event, "epoch": epoch, **details}
    path = local_path(Warehouse(warehouse).events(target))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(doc, sort_keys=True, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return doc


def read_events(warehouse: str, target: str) -> list[dict]:
    """Every event of ``target``, oldest first; a torn last line is ignored."""
    path = local_path(Warehouse(warehouse).events(target))
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.endswith("\n"):
                    out.append(json.loads(line))
    except FileNotFoundError:
        pass
    return out
