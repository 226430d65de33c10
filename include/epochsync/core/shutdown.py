"""Stopping on SIGTERM and SIGINT: children stopped, targets left at a committed epoch, one line.

The entry points (the ``epochsync`` verbs, ``make demo``, ``make airflow``) run inside
:func:`signals_raise`: SIGTERM and SIGINT raise :class:`Interrupted` (a
``KeyboardInterrupt``) in the main thread, so ``finally`` blocks and context managers run
(leases released, servers stopped) instead of the process vanishing mid-write.

- ``epochsync replicate`` rolls back the epoch it was applying
  (:func:`epochsync.stages.rollback.rollback_on_interrupt`) and exits 130 (SIGINT) or 143
  (SIGTERM) with one line saying where the target is.
- ``make demo`` and ``make airflow`` stop every process they started, including those in
  sessions of their own (``weed mini``, ``airflow standalone`` and its task processes,
  ``dag.test`` runs, the Spark Connect server: :func:`stop_processes` on the whole tree),
  then roll back any target left mid-epoch (:func:`epochsync.stages.rollback.settle_targets`)
  and say so in one line.

This module knows signals and processes only; the rollbacks live with the rollback stage,
which imports this module (never the other way round).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterable, Iterator

#: set by the first SIGTERM/SIGINT; threads that wait (a stalled fault) look at it
INTERRUPTED = threading.Event()


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT arrived; ``outcome`` says where the work was left."""

    def __init__(self, signum: int = signal.SIGINT, outcome: str = ""):
        super().__init__(signum)
        self.signum = int(signum)
        self.outcome = outcome

    @property
    def name(self) -> str:
        """Returns the signal's name (``SIGTERM``, ``SIGINT``)."""
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """Returns the process's exit status for this signal: 128 + its number."""
        return 128 + self.signum

    @classmethod
    def of(cls, exc: BaseException) -> Interrupted:
        """Returns ``exc`` if it is an :class:`Interrupted`, else an :class:`Interrupted` for SIGINT (a plain Ctrl-C)."""
        return exc if isinstance(exc, Interrupted) else cls(signal.SIGINT)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM and SIGINT raise :class:`Interrupted` in the main thread for the block's duration."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        INTERRUPTED.set()
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def raise_on_signals() -> None:
    """:func:`signals_raise` for the rest of the process (a Spark app's ``main``): Airflow stops a
    task with SIGTERM, and its lease is then released by the ``finally`` blocks instead of
    being left to expire."""
    if threading.current_thread() is threading.main_thread():

        def handler(signum, frame):
            INTERRUPTED.set()
            raise Interrupted(signum)

        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, handler)


@contextlib.contextmanager
def signals_deferred() -> Iterator[list[int]]:
    """Record SIGTERM/SIGINT instead of raising (a clean-up that must not be cut short); yields the
    list of signal numbers received."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    old = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def descendants(pid: int | None = None) -> list:
    """Every live process below ``pid`` (default: this one), whatever session it moved to."""
    import psutil

    try:
        return psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def stop_processes(procs: Iterable, *, grace: float = 10.0, keep: Iterable[int] = ()) -> int:
    """SIGTERM ``procs`` (and the process groups they lead), SIGKILL what is left after ``grace`` s.

    ``keep``: pids to leave alone (a store still needed for the rollback). Returns how many
    processes were signalled.
    """
    import psutil

    keep = set(keep)
    victims = [p for p in procs if p.pid not in keep and p.pid != os.getpid()]
    groups = set()
    for p in victims:
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(p.pid) == p.pid:  # a session or group leader: its group goes too
                groups.add(p.pid)
    for g in groups:
        with contextlib.suppress(OSError):
            os.killpg(g, signal.SIGTERM)
    for p in victims:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(victims, timeout=grace)
    for g in groups:
        with contextlib.suppress(OSError):
            os.killpg(g, signal.SIGKILL)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    return len(victims)


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (None: no such process; "" unreadable).

    A pid and its start time name one process for good: a recycled pid starts later.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    fields = text[text.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else ""


def process_running(pid: int, start: str = "") -> bool:
    """Whether ``pid`` is a live process (a zombie is not), and the one that started at ``start`` when given."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return False
    fields = text[text.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return False
    return not start or len(fields) <= 19 or fields[19] == start
