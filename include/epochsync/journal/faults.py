"""Fault injection for tests, the demo and the DAG's ``inject_failure`` param.

A spec says when a stage of an epoch fails::

    EPOCHSYNC_INJECT_FAILURE="after=K|at=F[,stage=apply|commit|rollback][,epoch=E][,target=NAME]
                              [,mode=raise|kill|stall][,repeat=1]"

- ``after=K``: the (K+1)-th mutation of the apply fails: its undo entry is already
  durable but the mutation is not done (the worst moment for a rollback). ``K=0``
  fails before anything changed. Mutations are counted across the driver and every
  executor of the apply (a counter file beside the undo journal, under a lock), in
  journal order: namespace operations, then data (each multipart part is one), then
  post operations (links, attributes, deletes).
- ``at=F`` (0 <= F < 1, apply only): ``after`` is that share of the plan's operations.
- ``stage=commit``: the commit's steps are counted instead (1 stats row, 2 manifest,
  3 scratch area, 4 committed view, 5 consumer cursor, 6 undo journal); ``after=1`` dies before the manifest,
  ``after=2`` right after it. ``stage=rollback``: each undo entry replayed is one, then
  the scratch clean-up. ``stage=cut`` (a live source's cut; ``target`` names the source): 1
  the snapshots taken and recorded, 2 the epoch's records published, before the source's
  state is committed; ``after=0`` dies right after the snapshots.
- ``epoch=E`` / ``target=NAME``: only that epoch / target (default: any).
- ``mode=raise`` (default) raises :class:`InjectedFailure`; ``mode=kill`` sends
  SIGKILL to the whole process group (a crashed worker: no cleanup runs at all);
  ``mode=stall`` waits there (up to 10 minutes) until the process is interrupted
  (SIGTERM/SIGINT, see :mod:`epochsync.core.shutdown`): a run caught mid-stage by a signal.
- by default a spec fires once per (target, epoch, stage), remembered by a file in the
  epoch's plan directory, so a retry or a rerun of the epoch succeeds; ``repeat=1``
  fires every time.

The same spec can be passed as ``inject=`` to :func:`epochsync.stages.apply.run_apply` and
``replicate`` (``--inject-failure``), which is how the DAG param reaches it; commit and
rollback read it from the environment variable.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from dataclasses import dataclass

from epochsync.core.errors import EpochsyncError
from epochsync.core.shutdown import process_running

ENV_VAR = "EPOCHSYNC_INJECT_FAILURE"


class InjectedFailure(EpochsyncError):
    """The failure a fault spec asked for (never raised unless one is set)."""


STAGES = ("apply", "commit", "rollback", "cut")
MODES = ("raise", "kill", "stall")


@dataclass(frozen=True)
class FaultSpec:
    """Where and how to inject a failure: after K mutations (or at a fraction), in which stage, epoch,
    target and mode."""

    after: int
    epoch: int | None = None
    target: str | None = None
    mode: str = "raise"
    repeat: bool = False
    stage: str = "apply"
    at: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> FaultSpec | None:
        """``after=3,epoch=2`` → FaultSpec; empty → None; anything else → a clear error."""
        if not text or not text.strip():
            return None
        fields: dict[str, str] = {}
        for part in text.split(","):
            if "=" not in part:
                raise EpochsyncError(f"{ENV_VAR}: expected key=value items, got {part!r} in {text!r}")
            k, v = part.split("=", 1)
            fields[k.strip()] = v.strip()
        unknown = set(fields) - {"after", "at", "epoch", "target", "mode", "repeat", "stage"}
        if unknown or ("after" in fields) == ("at" in fields):
            raise EpochsyncError(
                f"{ENV_VAR}: {text!r}: need after=K or at=F; optional stage=apply|commit|rollback|cut, epoch=E, "
                "target=NAME, mode=raise|kill|stall, repeat=1"
            )
        try:
            spec = cls(
                after=int(fields.get("after", 0)),
                epoch=int(fields["epoch"]) if "epoch" in fields else None,
                target=fields.get("target"),
                mode=fields.get("mode", "raise"),
                repeat=fields.get("repeat", "0") in ("1", "true", "yes"),
                stage=fields.get("stage", "apply"),
                at=float(fields["at"]) if "at" in fields else None,
            )
        except ValueError:
            raise EpochsyncError(f"{ENV_VAR}: {text!r}: after and epoch are whole numbers, at a fraction") from None
        if spec.mode not in MODES or spec.after < 0 or spec.stage not in STAGES:
            raise EpochsyncError(
                f"{ENV_VAR}: {text!r}: mode is {'|'.join(MODES)}, stage {'|'.join(STAGES)}, after >= 0"
            )
        if spec.at is not None and not (0 <= spec.at < 1 and spec.stage == "apply"):
            raise EpochsyncError(f"{ENV_VAR}: {text!r}: at=F is a fraction 0 <= F < 1 of an apply's operations")
        return spec

    def to_text(self) -> str:
        """Returns the spec in the form :meth:`parse` reads (for messages and fired markers)."""
        parts = [f"after={self.after}" if self.at is None else f"at={self.at:g}"]
        if self.stage != "apply":
            parts.append(f"stage={self.stage}")
        if self.epoch is not None:
            parts.append(f"epoch={self.epoch}")
        if self.target:
            parts.append(f"target={self.target}")
        parts.append(f"mode={self.mode}")
        if self.repeat:
            parts.append("repeat=1")
        return ",".join(parts)

    def applies(self, target: str, epoch: int, stage: str = "apply") -> bool:
        """Returns whether the spec is for this target, epoch and stage."""
        return (
            self.stage == stage
            and (self.epoch is None or self.epoch == epoch)
            and (self.target is None or self.target == target)
        )


def resolve(inject: str | FaultSpec | None) -> FaultSpec | None:
    """An explicit spec wins over the environment variable."""
    if isinstance(inject, FaultSpec):
        return inject
    return FaultSpec.parse(inject) if inject else FaultSpec.parse(os.environ.get(ENV_VAR))


class FaultCounter:
    """Counts mutations across processes and fires the spec once the count passes K.

    Picklable (paths, the spec and who made it), so executors get their own copy. A kill
    that fires on an executor (a Spark Connect server's worker) kills the process group
    of the run that made the counter, when it runs on the same host: the writer dies, not
    the shared server, and the executor's task stops there; its sibling tasks are the
    stragglers a rollback must wait for.
    """

    def __init__(self, spec: FaultSpec | None, counter_file: str, fired_file: str):
        self.spec = spec
        self.counter_file = counter_file
        self.fired_file = fired_file
        self.owner_pid = os.getpid()
        self.owner_pgid = os.getpgid(0)
        self.owner_boot = _boot_id()

    @property
    def armed(self) -> bool:
        """Returns whether the counter can still fire: a spec is set and has not fired (or repeats)."""
        return self.spec is not None and (self.spec.repeat or not os.path.exists(self.fired_file))

    def tick(self, what: str) -> None:
        """Called after each undo entry is durable, before its mutation."""
        spec = self.spec
        if spec is None or not self.armed:
            return
        with open(self.counter_file, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            n = int(f.read().strip() or 0) + 1
            f.seek(0)
            f.truncate()
            f.write(str(n))
            f.flush()
            os.fsync(f.fileno())
            fire = n > spec.after
            if fire:
                with open(self.fired_file, "w") as m:
                    m.write(spec.to_text() + "\n")
                    m.flush()
                    os.fsync(m.fileno())
        if fire:
            if spec.mode == "kill" and _boot_id() == self.owner_boot:
                os.killpg(self.owner_pgid, signal.SIGKILL)  # the run (and this process if it is in that group)
            if spec.mode == "stall":
                _stall(self.fired_file, os.path.dirname(self.counter_file), self.owner_pid, self.owner_boot)
            where = "mutation" if spec.stage == "apply" else f"{spec.stage} step"
            raise InjectedFailure(f"injected failure at {where} {n} ({what}) [{spec.to_text()}]")


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _stall(fired_file: str, work_dir: str, owner_pid: int, owner_boot: str, limit_s: float = 600.0) -> None:
    """Wait until the run is interrupted: a signal here (it raises in the main thread), or,
    on an executor, the rollback's ``ABORTED`` marker or the run's process gone."""
    from epochsync.core.shutdown import INTERRUPTED

    with open(fired_file + ".stalled", "w") as f:
        f.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + limit_s
    while not INTERRUPTED.is_set() and time.monotonic() < deadline:
        gone = _boot_id() == owner_boot and not process_running(owner_pid)
        if gone or os.path.exists(os.path.join(work_dir, "ABORTED")):
            return
        time.sleep(0.05)
