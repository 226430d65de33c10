"""A history on a live Gluster volume: workload on the FUSE mount, a cut, replicate, compare with the cut.

The tests of the gluster source share one volume (the session's ``gluster_stack``) and walk it
through one history of epochs, as a user would: each step runs a shell workload on the mount,
takes the next cut, replicates it into every target and checks each replica against the cut's
ground truth (:func:`epochsync_dev.gluster_truth.cut_truth`: the brick snapshots walked
directly, not through the source's resolver).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from epochsync.core.config import load_config
from epochsync.sources.gluster.reader import data_roots
from epochsync.stages.audit import audit_target
from epochsync.stages.cut import cut_source, read_cut
from epochsync.stages.replicate import replicate
from epochsync.targets import open_target
from epochsync_dev.gluster_truth import compare, cut_truth


class GlusterHistory:
    """One source ``vol`` over the stack's volume, with the given targets (see the module docstring)."""

    def __init__(self, stack, folder: Path, spark, targets: list[dict] | None = None, *, source: str = "vol"):
        self.stack = stack
        self.volume = stack.volume
        self.mount = Path(self.volume.mount)
        self.folder = Path(folder)
        self.spark = spark
        self.source = source
        targets = targets or [
            {"name": "local", "source": source, "kind": "posix", "path": str(self.folder / "replica")}
        ]
        doc = self.volume.config(str(self.folder / "warehouse"), targets, source=source)
        self.config_path = self.folder / "epochsync.yaml"
        self.config_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.cfg = load_config(self.config_path)
        self.lines: list[str] = []

    def use_barrier(self, on: bool) -> None:
        """The cuts from now on hold namespace operations with Gluster's barrier (``cut.barrier``), or not."""
        doc = yaml.safe_load(self.config_path.read_text())
        doc["sources"][0].setdefault("cut", {})["barrier"] = on
        self.config_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.cfg = load_config(self.config_path)

    # ------------------------------------------------------------------ steps
    def sh(self, script: str, *, check: bool = True) -> str:
        """Runs a bash script in the mount; returns its output."""
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script], cwd=self.mount, capture_output=True, text=True, timeout=600
        )
        if check and done.returncode != 0:
            raise AssertionError(f"workload failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        return done.stdout

    def cut(self, through: int | None = None) -> dict:
        """Takes the next cut (or every cut up to ``through``); returns the last cut's figures."""
        out = cut_source(self.cfg, self.source, through, progress=self.lines.append)
        return out if out.get("noop") else out["cuts"][-1]

    def replicate(self, target: str, epoch: int, **kw) -> list[dict]:
        """Replicates every cut up to ``epoch`` into ``target``; returns the stats rows."""
        return replicate(self.cfg, target, epoch, spark=self.spark, progress=self.lines.append, **kw)

    def read_cut(self, epoch: int) -> dict:
        """Returns the record of cut ``epoch``."""
        rec = read_cut(self.cfg, self.source, epoch)
        assert rec is not None, f"no cut {epoch}"
        return rec

    def roots(self, epoch: int) -> list[str]:
        """Returns the brick directories of cut ``epoch`` its bytes are read from (a replicated
        volume: each set's reader)."""
        rec = read_cut(self.cfg, self.source, epoch)
        assert rec is not None, f"no cut {epoch}"
        return [root for _, root in sorted(data_roots(rec).items())]

    def truth(self, epoch: int) -> dict[str, dict]:
        """Returns the ground truth of cut ``epoch``."""
        return cut_truth(self.roots(epoch))

    def problems(self, target: str, epoch: int) -> list[str]:
        """How ``target`` differs from cut ``epoch`` (empty: equal in bytes, modes, owners, xattrs,
        symlink targets, mtimes and hard links)."""
        return compare(open_target(self.cfg.target(target)), self.truth(epoch), limit=30)

    def step(self, script: str | None = None, targets: tuple[str, ...] = ("local",)) -> int:
        """A workload, a cut, every target replicated and checked equal to the cut; returns the epoch."""
        if script:
            self.sh(script)
        epoch = self.cut()["epoch"]
        for t in targets:
            self.replicate(t, epoch)
            problems = self.problems(t, epoch)
            assert not problems, f"{t} at epoch {epoch} differs from its cut:\n  " + "\n  ".join(problems)
            # the audit reads the cut as the source does, the truth walks the snapshots directly
            audit = self.audit(t)
            assert not audit["differences"], f"the audit of {t} at epoch {epoch}: " + "; ".join(
                map(str, audit["differences"][:10])
            )
        return epoch

    def audit(self, target: str, *, deep: bool = False) -> dict:
        """``epochsync audit`` of ``target`` at its committed epoch, against its cut."""
        return audit_target(self.cfg, target, deep=deep)

    def records(self, epoch: int) -> list[dict]:
        """Returns the canonical records cut ``epoch`` published, every brick's."""
        out = []
        base = Path(self.cfg.sources[0].changelogs.uri.removeprefix("file://"))
        for brick in sorted(os.listdir(base)):
            path = base / brick / f"{epoch:010d}.jsonl"
            if path.exists():
                out.extend(json.loads(line) for line in path.read_text().splitlines() if line)
        return out
