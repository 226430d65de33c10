"""glusterfind beside ``epochsync changes``: the same windows of a live volume, listed by both.

glusterfind is GlusterFS's own lister of changes. A session remembers where its last listing
ended; ``glusterfind pre`` lists what changed since then (``NEW``, ``MODIFY``, ``DELETE``,
``RENAME`` lines, paths relative to the volume's root, encoded), ``post`` moves the session on.
``pre`` lists changelogs up to one rollover before the moment it runs, so a window of
glusterfind ends at a cut when ``pre`` runs a rollover after the cut and nothing was written
in between.

How to line the two up (what the suite's test and the benchmark do)::

    session = Session(name, volume)
    session.create()           # waits one rollover: what is written from now on is in its first window
    cut E1 (and replicate it)
    for each window: workload, cut E2, replicate E2, then
        row = compare_window(cfg, target, E1, E2, session, spark=spark)

:func:`compare_window` times ``epochsync changes`` (in this process on the given Spark session,
and as the command line) and ``glusterfind pre``/``post``, and compares the two listings line by
line (:func:`compare`): every line only one side has must be one of :data:`REASONS`, checked
against the rest of both listings, or it is reported unexplained.

Needs root, the ``glusterfind`` command (Debian: ``glusterfs-server``) and python3-pyxattr for
the interpreter glusterfind runs with (:class:`GlusterfindUnavailable` says which is missing).
``create`` turns on ``storage.build-pgfid`` and ``changelog.capture-del-path`` on the volume,
as glusterfind always does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from epochsync_dev.gluster import gluster, run

#: glusterfind's session folder (``session_dir`` in its tool.conf)
SESSIONS = Path("/var/lib/glusterd/glusterfind")
#: ``glusterfind create`` fails without it, and the Debian package does not make it
KEYS = SESSIONS / ".keys"

#: why a line is only in one listing, by key (:func:`compare`)
REASONS = {
    "shard": "Gluster's own shard files (features.shard): glusterfind lists them (and .shard/.remove_me), "
    "epochsync lists the file they belong to",
    "directory_modify": "a directory's mode, owner, times or xattrs changed: glusterfind never lists a "
    "directory's MODIFY (its gfid-to-path step finds the paths of files only)",
    "replaced": "the file a rename replaced: Gluster logs no unlink of it (unless DHT removed it from "
    "another brick), so glusterfind does not list its DELETE",
    "rename_without_new_path": "Gluster logged the rename's new parent as the null gfid: glusterfind "
    "lists the rename without its new path",
    "renamed_and_changed": "renamed and changed in one window: glusterfind's gfid-to-path step writes "
    "the new path over the rename's old one, and the rename is dropped",
    "renamed_then_deleted": "renamed, then deleted, in one window: glusterfind lists the rename and the "
    "delete under the new name, epochsync the delete under the old name",
    "link_and_changed": "a file changed and got a new name in one window: glusterfind's gfid-to-path step "
    "writes every name of the file into the new name's NEW, so it lists each name as NEW",
    "relinked": "a file with several names lost one and gained another: epochsync's diff pairs the two as "
    "a RENAME (the net change), glusterfind lists the DELETE and the NEW",
}


class GlusterfindUnavailable(RuntimeError):
    """glusterfind cannot run here; the message is the one line that says why."""


class GlusterfindHung(RuntimeError):
    """A glusterfind command did not end in time; the message holds its processes and log tails."""


#: glusterfind's log folder (``log_dir`` in its tool.conf): one folder per session
LOGS = Path("/var/log/glusterfs/glusterfind")
#: seconds a ``pre`` may take before it is killed and run again. A window of the suite's test
#: takes 1-5 s. CI once saw a ``pre`` that had not ended after 300 s, with no logs kept. Read in
#: glusterfs v10.3 (the same through 11.x and devel), libgfchangelog has one wait without end
#: that fits: ``gf_history_changelog`` starts its parsing thread, then sets ``hist_done = 1``
#: (gf-history-changelog.c:983, :1017); a thread that already ended and set 0 (:664) is
#: overwritten, and ``gf_history_changelog_scan`` sleeps a second at a time forever (:252-306).
#: A window of mostly empty changelogs makes that thread short enough to lose the race on a
#: loaded 2-core guest. Not confirmed: the fingerprint is a brick's ``changelog.py`` in
#: ``do_nanosleep`` and ``hist_done 1, is_last_scan: 0`` once a second in its log, both of
#: which :func:`run_bounded` now keeps. A new ``pre`` is a new process, a fresh draw.
PRE_TIMEOUT_S = 90.0


def run_bounded(cmd: list[str], *, timeout: float, logs: Path | None = None) -> subprocess.CompletedProcess:
    """Runs ``cmd`` in its own process group, as :func:`epochsync_dev.gluster.run` does (a failure
    raises RuntimeError with its last line). Past ``timeout`` it kills the whole group (glusterfind
    starts a process per brick, which a kill of the parent alone leaves behind, registered with
    the brick) and raises :class:`GlusterfindHung` naming the processes that were left and the
    last lines of each log under ``logs``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        left = subprocess.run(
            ["ps", "-o", "pid,stat,wchan:24,etimes,args", "-g", str(proc.pid)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.rstrip()
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise GlusterfindHung(
            f"{' '.join(cmd)}: did not end in {timeout:.0f} s; killed. Its processes:\n{left}" + _log_tails(logs)
        ) from None
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if done.returncode != 0:
        said = (err.strip() or out.strip() or f"exit {done.returncode}").splitlines()[-1]
        raise RuntimeError(f"{' '.join(cmd)}: {said}")
    return done


def _log_tails(folder: Path | None, lines: int = 12) -> str:
    """The last ``lines`` lines of each log file under ``folder``, for an error message."""
    if folder is None or not folder.is_dir():
        return ""
    parts = []
    for path in sorted(folder.rglob("*.log")):
        tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
        parts.append(f"\n--- {path} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "".join(parts)


def _glusterfind() -> str | None:
    return shutil.which("glusterfind") or next(
        (p for p in ("/usr/bin/glusterfind", "/usr/sbin/glusterfind") if os.path.exists(p)), None
    )


def check_glusterfind() -> str:
    """Returns the glusterfind command; raises :class:`GlusterfindUnavailable` when it cannot run
    (not root, not installed, or its interpreter lacks the ``xattr`` module: python3-pyxattr)."""
    if os.geteuid() != 0:
        raise GlusterfindUnavailable("glusterfind runs as root (it reads the bricks and the volume's options)")
    cmd = _glusterfind()
    if cmd is None:
        raise GlusterfindUnavailable("no glusterfind command (Debian: apt-get install glusterfs-server)")
    with open(cmd, "rb") as f:
        first = f.readline().decode(errors="replace").strip()
    python = first[2:].split()[0] if first.startswith("#!") else "python3"
    done = subprocess.run([python, "-c", "import xattr"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise GlusterfindUnavailable(
            f"glusterfind's interpreter {python} has no xattr module (Debian: apt-get install python3-pyxattr)"
        )
    return cmd


def rollover_seconds(volume: str) -> int:
    """The volume's ``changelog.rollover-time`` (what glusterfind's ``pre`` subtracts from now)."""
    done = gluster("volume", "get", volume, "changelog.rollover-time")
    for line in done.stdout.splitlines():
        if line.startswith("changelog.rollover-time"):
            return int(line.split()[1])
    raise RuntimeError(f"gluster volume get {volume}: no changelog.rollover-time in {done.stdout!r}")


@dataclass
class Session:
    """One glusterfind session on ``volume`` (its state in :data:`SESSIONS`/``name``)."""

    name: str
    volume: str
    rollover: int | None = None
    #: what each killed ``pre`` was doing (:meth:`pre`), oldest first
    hangs: list[str] = field(default_factory=list)

    def create(self, *, wait: bool = True) -> float:
        """``glusterfind create``; returns its seconds. With ``wait``, returns only once what is
        written from now on falls in the session's first window (one rollover and a second)."""
        cmd = check_glusterfind()
        KEYS.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        run([cmd, "create", self.name, self.volume], timeout=300)
        took = time.monotonic() - t0
        self.rollover = rollover_seconds(self.volume)
        if wait:
            time.sleep(self.rollover + 1)
        return took

    def pre(self, out: Path, *, no_encode: bool = False, regenerate: bool = False) -> tuple[list[str], float]:
        """``glusterfind pre --disable-partial`` into ``out``; returns its lines and seconds.

        A ``pre`` that has not ended after :data:`PRE_TIMEOUT_S` is killed with everything it
        started and run once more with ``--regenerate-outfile``: a ``pre`` moves nothing on until
        ``post``, so the second one starts where the first did and ends a rollover before it runs
        (the same window when nothing was written in between, as :func:`compare_window` runs it);
        :attr:`hangs` keeps what the killed one was doing. A second hang raises :class:`GlusterfindHung`. The seconds are the
        attempt that ended."""
        args = [_glusterfind() or "glusterfind", "pre", self.name, self.volume, str(out), "--disable-partial"]
        args += ["--no-encode"] if no_encode else []
        for attempt in (1, 2):
            again = ["--regenerate-outfile"] if regenerate or attempt > 1 else []
            t0 = time.monotonic()
            try:
                run_bounded(args + again, timeout=PRE_TIMEOUT_S, logs=self.logs)
            except GlusterfindHung as exc:
                self.hangs.append(str(exc))
                if attempt == 2:
                    raise
                continue
            took = time.monotonic() - t0
            return Path(out).read_text(encoding="utf-8").splitlines(), took
        raise AssertionError("unreachable")

    @property
    def logs(self) -> Path:
        """Where glusterfind logs this session (its ``log_dir`` in tool.conf)."""
        return LOGS / self.name

    def post(self) -> float:
        """``glusterfind post``: the next ``pre`` starts where the last one ended; returns its seconds."""
        t0 = time.monotonic()
        run([_glusterfind() or "glusterfind", "post", self.name, self.volume], timeout=300)
        return time.monotonic() - t0

    def delete(self) -> None:
        """``glusterfind delete`` (also when the volume is gone), then whatever it left."""
        cmd = _glusterfind()
        if cmd:
            subprocess.run(
                [cmd, "delete", self.name, self.volume], input="y\n", capture_output=True, text=True, check=False
            )
        shutil.rmtree(SESSIONS / self.name, ignore_errors=True)
        shutil.rmtree(self.logs, ignore_errors=True)

    def wait_for_cut(self, cut_time_ns: int) -> None:
        """Sleeps until ``pre`` sees every changelog up to a cut taken at ``cut_time_ns``."""
        rollover = self.rollover if self.rollover is not None else rollover_seconds(self.volume)
        delay = cut_time_ns / 1e9 + rollover + 1 - time.time()
        if delay > 0:
            time.sleep(delay)


# --------------------------------------------------------------------------- comparison


@dataclass
class Comparison:
    """Two listings of one window, line by line."""

    same: int = 0
    explained: list[tuple[str, str, str]] = field(default_factory=list)  # (side, line, reason)
    unexplained: list[tuple[str, str]] = field(default_factory=list)  # (side, line)

    def reasons(self) -> dict[str, int]:
        """Returns how many lines each reason explained."""
        return dict(sorted(Counter(r for _, _, r in self.explained).items()))

    def as_dict(self) -> dict:
        """Returns the comparison as plain values (a benchmark row's part)."""
        return {
            "same": self.same,
            "explained": self.reasons(),
            "unexplained": [f"{side}: {line}" for side, line in self.unexplained],
        }


def _fields(line: str) -> list[str]:
    return line.split(" ")


def compare(ours: list[str], theirs: list[str], entries: list[dict]) -> Comparison:
    """Compares ``epochsync changes --format glusterfind`` lines (``ours``, from ``entries``:
    :func:`epochsync.report.changes.gather_entries` of the window) with ``glusterfind pre``'s
    (``theirs``), both encoded and space-separated.

    Lines both have are the same; every other line is explained by one of :data:`REASONS`
    when the rest of the two listings bears the reason out, else it is unexplained.
    """
    from epochsync.report.changes import glusterfind_path

    ours_c, theirs_c = Counter(ours), Counter(theirs)
    result = Comparison(same=sum((ours_c & theirs_c).values()))
    only_ours = list((ours_c - theirs_c).elements())
    only_theirs = list((theirs_c - ours_c).elements())
    our_set, their_set = set(ours), set(theirs)

    def explain(side: str, line: str, reason: str) -> None:
        (only_ours if side == "epochsync" else only_theirs).remove(line)
        result.explained.append((side, line, reason))

    directories = {glusterfind_path(p) for e in entries if e["type"] == "dir" for p in e["new_paths"]}
    paths_of = {e["fid"]: {glusterfind_path(p) for p in e["new_paths"]} for e in entries}

    for line in list(only_theirs):
        kind, path, *_ = _fields(line) + [""]
        if path != ".shard" and not path.startswith(".shard/"):
            continue
        shard = re.fullmatch(r"\.shard/([0-9a-f-]{36})\.\d+", path)
        if shard and kind in ("NEW", "MODIFY"):
            names = paths_of.get(shard.group(1), set())
            if not any(f"MODIFY {p}" in our_set or f"NEW {p}" in our_set for p in names):
                continue  # a shard changed and epochsync lists no change of its file: unexplained
        explain("glusterfind", line, "shard")

    for line in list(only_theirs):
        f = _fields(line)
        if f[0] == "RENAME" and len(f) == 2:
            match = next((o for o in only_ours if _fields(o)[:2] == f and len(_fields(o)) == 3), None)
            if match is not None:
                explain("glusterfind", line, "rename_without_new_path")
                explain("epochsync", match, "rename_without_new_path")

    for line in list(only_theirs):
        f = _fields(line)
        if f[0] != "RENAME" or len(f) != 3 or f"DELETE {f[2]}" not in their_set or f"DELETE {f[1]}" not in our_set:
            continue
        old, new = f[1], f[2]
        for d in [d for d in only_theirs if d == f"DELETE {new}" or d.startswith(f"DELETE {new}/")]:
            mine = "DELETE " + old + d[len("DELETE ") + len(new) :]
            if mine in only_ours:
                explain("glusterfind", d, "renamed_then_deleted")
                explain("epochsync", mine, "renamed_then_deleted")
        explain("glusterfind", line, "renamed_then_deleted")

    for line in list(only_theirs):
        f = _fields(line)
        if f[0] == "NEW" and f"MODIFY {f[1]}" in our_set and f"MODIFY {f[1]}" in their_set:
            explain("glusterfind", line, "link_and_changed")

    for line in list(only_ours):
        f = _fields(line)
        if f[0] == "RENAME" and len(f) == 3 and f"DELETE {f[1]}" in only_theirs and f"NEW {f[2]}" in only_theirs:
            explain("epochsync", line, "relinked")
            explain("glusterfind", f"DELETE {f[1]}", "relinked")
            explain("glusterfind", f"NEW {f[2]}", "relinked")

    for line in list(only_ours):
        f = _fields(line)
        if f[0] == "RENAME" and len(f) == 3:
            old, new = f[1], f[2]
            changed = f"MODIFY {new}" in their_set and f"MODIFY {new}" in our_set
            if changed and not any(_fields(t)[:2] == ["RENAME", old] for t in their_set):
                explain("epochsync", line, "renamed_and_changed")
        elif f[0] == "DELETE" and any(_fields(o)[0] == "RENAME" and _fields(o)[-1] == f[1] for o in our_set):
            explain("epochsync", line, "replaced")
        elif f[0] == "MODIFY" and f[1] in directories:
            explain("epochsync", line, "directory_modify")

    result.unexplained = [("epochsync", x) for x in only_ours] + [("glusterfind", x) for x in only_theirs]
    return result


# --------------------------------------------------------------------------- one window, timed


def compare_window(
    cfg, target: str, e1: int, e2: int, session: Session, *, spark, out_dir, cli: bool = True, raw: bool = False
) -> dict:
    """One window side by side: ``epochsync changes --from e1 --to e2 --format glusterfind`` against
    ``glusterfind pre``/``post`` of ``session``, both timed; returns a row (see the module docstring
    for the order of calls this assumes).

    epochsync is timed twice: in this process on ``spark`` (a warm session: what a service pays)
    and, with ``cli``, as the command line in a new process (what an operator pays: the
    interpreter, the imports, a Spark Connect client, then the same work; the config's
    ``spark.remote`` decides which Spark it reaches). Its lines must be the same both ways.

    Row: ``window``, ``epochsync_s``, ``epochsync_cli_s`` (None without ``cli``),
    ``glusterfind_pre_s``, ``glusterfind_post_s``, ``lines`` (each side's count), ``same``,
    ``explained`` (lines per reason), ``unexplained`` (lines), ``load`` (1-minute load average),
    ``glusterfind_hangs`` (the ``pre`` calls of this window killed and run again, :meth:`Session.pre`).
    With ``raw``, also ``raw``: both listings' text with ``--no-encode`` (glusterfind's from a second
    ``pre --regenerate-outfile`` of the same window).
    """
    from epochsync.report.changes import entries_between, glusterfind_lines
    from epochsync.stages.cut import read_cut

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tcfg = cfg.target(target)
    t0 = time.monotonic()
    entries = entries_between(cfg, tcfg, e1, e2, spark)
    ours = glusterfind_lines(entries)
    api_s = time.monotonic() - t0
    cli_s = None
    if cli:
        args = [sys.executable, "-m", "epochsync.cli", "changes", "--config", str(cfg.file), "--target", target]
        args += ["--from", str(e1), "--to", str(e2), "--format", "glusterfind"]
        t0 = time.monotonic()
        done = run(args, timeout=300)
        cli_s = time.monotonic() - t0
        if done.stdout.splitlines() != ours:
            raise AssertionError(
                f"epochsync changes ... --format glusterfind printed other lines than glusterfind_lines: {done.stdout!r}"
            )
    cut = read_cut(cfg, tcfg.source, e2)
    if cut is not None:
        session.wait_for_cut(int(cut["cut"]["time_ns"]))
    hangs_before = len(session.hangs)
    theirs, pre_s = session.pre(out_dir / f"glusterfind-{e1}-{e2}.txt")
    texts = {}
    if raw:
        plain = out_dir / f"glusterfind-{e1}-{e2}.no-encode.txt"
        session.pre(plain, no_encode=True, regenerate=True)
        texts = {
            "glusterfind": plain.read_text(encoding="utf-8"),
            "epochsync": "".join(line + "\n" for line in glusterfind_lines(entries, encode=False)),
        }
    post_s = session.post()
    (out_dir / f"epochsync-{e1}-{e2}.txt").write_text("".join(line + "\n" for line in ours), encoding="utf-8")
    result = compare(ours, theirs, entries)
    return {
        "window": [e1, e2],
        "epochsync_s": round(api_s, 3),
        "epochsync_cli_s": None if cli_s is None else round(cli_s, 3),
        "glusterfind_pre_s": round(pre_s, 3),
        "glusterfind_post_s": round(post_s, 3),
        "glusterfind_hangs": len(session.hangs) - hangs_before,
        "lines": {"epochsync": len(ours), "glusterfind": len(theirs)},
        **result.as_dict(),
        "load": os.getloadavg()[0],
        **({"raw": texts} if raw else {}),
    }
