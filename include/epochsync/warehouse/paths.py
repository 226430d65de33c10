"""Warehouse layout: every stage's output under a deterministic path (DESIGN section 5).

A retried task overwrites its own output, so every path is a pure function of
(source or target, epoch, ...). Defined here once; nothing else builds these strings.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from urllib.parse import urlparse


class Warehouse:
    """Every location in the warehouse at ``uri``; each method returns a URI under it (nothing is read or written)."""

    def __init__(self, uri: str):
        self.uri = uri.rstrip("/")

    def _join(self, *parts: str) -> str:
        return "/".join([self.uri, *parts])

    # --- source side
    def records(self, source: str, epoch: int | None = None) -> str:
        """Canonical records as Parquet, partitioned ``epoch=/server=``."""
        base = self._join("records", f"source={source}")
        return base if epoch is None else f"{base}/epoch={epoch}"

    def quarantine(self, source: str, epoch: int) -> str:
        """Returns where ingest puts the lines of ``source``'s epoch it could not parse (quarantine)."""
        return self._join("quarantine", f"source={source}", f"epoch={epoch}")

    def cursors(self, source: str) -> str:
        """Consumer cursors: one JSON file per consumer (target)."""
        return self._join("cursors", f"source={source}")

    def cursor(self, source: str, consumer: str) -> str:
        """Returns the JSON file of one consumer's cursor over ``source``."""
        return f"{self.cursors(source)}/{consumer}.json"

    # --- a live source's cuts (gluster)
    def cuts(self, source: str) -> str:
        """Returns the folder of ``source``'s cuts: one ``epoch=E.json`` record each, the source's
        state (``state.sqlite``), the cut lock, and ``changelogs/<brick>/`` (the epochs' canonical records)."""
        return self._join("cuts", f"source={source}")

    def cut(self, source: str, epoch: int) -> str:
        """Returns the record of ``source``'s cut ``epoch`` (JSON: snapshots, positions, figures)."""
        return f"{self.cuts(source)}/epoch={epoch}.json"

    def cut_changelogs(self, source: str) -> str:
        """Returns where ``source``'s cuts publish its canonical records (one folder per brick)."""
        return f"{self.cuts(source)}/changelogs"

    # --- target side
    def snapshot(self, target: str, epoch: int) -> str:
        """Returns the snapshot of ``target`` at ``epoch`` (Parquet)."""
        return self._join("snapshots", f"target={target}", f"epoch={epoch}")

    def snapshots(self, target: str) -> str:
        """Returns the folder of every snapshot of ``target`` (partitions ``epoch=``)."""
        return self._join("snapshots", f"target={target}")

    def changes(self, target: str, epoch: int) -> str:
        """The net change set of ``epoch`` for ``target``."""
        return self._join("changes", f"target={target}", f"epoch={epoch}")

    def cookie_groups(self, target: str, epoch: int) -> str:
        """Cross-server operations (records sharing a cookie) seen by the merge of ``epoch``."""
        return self._join("cookies", f"target={target}", f"epoch={epoch}")

    def plan(self, target: str, epoch: int) -> str:
        """Returns the plan folder of ``target``'s epoch (``plan.json``, stage figures, ``verify.json``)."""
        return self._join("plans", f"target={target}", f"epoch={epoch}")

    def undo(self, target: str, epoch: int) -> str:
        """Returns the undo journal folder of ``target``'s epoch."""
        return self._join("undo", f"target={target}", f"epoch={epoch}")

    def repair_undo(self, target: str) -> str:
        """Returns the undo journal folder of ``target``'s repair (``epochsync audit --repair``)."""
        return self._join("undo", f"target={target}", "repair")

    def repair_plan(self, target: str) -> str:
        """Returns the plan folder of ``target``'s last repair."""
        return self._join("plans", f"target={target}", "repair")

    def stats(self, target: str, epoch: int) -> str:
        """Returns the stats row of ``target``'s committed epoch (JSON)."""
        return self._join("stats", f"target={target}", f"epoch={epoch}.json")

    def stats_dir(self, target: str) -> str:
        """Returns the folder of ``target``'s stats rows."""
        return self._join("stats", f"target={target}")

    def store_probe(self, target: str) -> str:
        """What ``target``'s store was found to honour (JSON: conditional writes), probed once."""
        return self._join("probes", f"target={target}.json")

    def events(self, target: str) -> str:
        """Append-only JSON Lines of what happened to a target (commits, failures, rollbacks)."""
        return self._join("events", f"target={target}.jsonl")


def local_path(uri: str) -> str:
    """The local path of a ``file://`` URI (or a plain path); others raise ValueError."""
    if "://" not in uri:
        return uri
    u = urlparse(uri)
    if u.scheme != "file":
        raise ValueError(f"not a local warehouse URI: {uri}")
    return u.path


def epoch_partitions(uri: str) -> list[int]:
    """The epochs E with an ``epoch=E`` folder under a local (``file://``) ``uri``, sorted."""
    import os

    path = local_path(uri)
    if not os.path.isdir(path):
        return []
    out = []
    for name in os.listdir(path):
        if name.startswith("epoch="):
            try:
                out.append(int(name.split("=", 1)[1]))
            except ValueError:
                continue
    return sorted(out)


# --------------------------------------------------------------------------- the checkout


def project_dir() -> Path:
    """The checkout holding ``spark_apps/`` (``$EPOCHSYNC_PROJECT_DIR`` overrides, e.g. in containers)."""
    env = os.environ.get("EPOCHSYNC_PROJECT_DIR")
    if env:
        return Path(env)
    # include/epochsync/warehouse/paths.py -> the checkout
    return Path(__file__).resolve().parents[3]


def build_dir() -> Path:
    """Where built files go (package zips, the JVM class-data archive): ``$EPOCHSYNC_BUILD_DIR``,
    else ``build/`` of the checkout, else a temp folder."""
    env = os.environ.get("EPOCHSYNC_BUILD_DIR")
    candidates = [Path(env)] if env else [project_dir() / "build", Path(tempfile.gettempdir()) / "epochsync-build"]
    for c in candidates:
        try:
            c.mkdir(parents=True, exist_ok=True)
            if os.access(c, os.W_OK):
                return c
        except OSError:
            continue
    raise OSError(f"no writable build folder among {', '.join(map(str, candidates))}")
