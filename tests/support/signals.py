"""A test run stopped by a signal tears its fixtures down, as Ctrl-C does."""

from __future__ import annotations

import signal


def teardown_on_signal() -> None:
    """Make SIGTERM and SIGHUP end the run as Ctrl-C does (``KeyboardInterrupt``): pytest then runs
    the session's teardown, which stops what the fixtures started (SeaweedFS, the Spark Connect
    server, Airflow, glusterd and its volumes, loop images). Python's own SIGTERM ends the
    process at once: a run stopped by ``timeout`` left SeaweedFS and the Connect server
    running, orphaned, until killed by hand (2026-11-29). A handler someone else installed is
    kept. Call it from the main thread (``pytest_configure``)."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, interrupt)
