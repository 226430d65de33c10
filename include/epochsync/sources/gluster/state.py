"""The source side's memory of a gluster source: what its cuts have published so far.

One SQLite file per source in the warehouse (``cuts/source=S/state.sqlite``): every gfid the
published records have created and not removed, with its type, the brick holding its data,
its size, its names and the names of its ``user.*`` xattrs; plus, per brick, the changelog
position of the last cut and the next record index; plus the gfids the next cut must look at
again whatever their records say (:attr:`carry`). The replica's namespace at the last
resolved epoch is exactly this table: a cut compares what the bricks show with it, never with
an earlier snapshot, so a change whose record reached the changelog only after a cut is
published in the next epoch instead of being lost.

Only the rows of the gfids an epoch touches are read and written (indexed by gfid and by
``(parent, name)``): a cut costs what changed, not the size of the namespace.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass, field

from epochsync.warehouse.paths import Warehouse, local_path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS node (
    gfid TEXT PRIMARY KEY,
    type TEXT NOT NULL,
    brick TEXT,
    size INTEGER,
    xattrs TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE IF NOT EXISTS name (
    pgfid TEXT NOT NULL,
    name TEXT NOT NULL,
    gfid TEXT NOT NULL,
    PRIMARY KEY (pgfid, name)
);
CREATE INDEX IF NOT EXISTS name_gfid ON name (gfid);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass
class Known:
    """A gfid as the published records left it."""

    gfid: str
    type: str
    brick: str | None
    size: int | None
    xattrs: list[str] = field(default_factory=list)
    names: list[tuple[str, str]] = field(default_factory=list)


class SourceState:
    """The SQLite memory of one gluster source (see the module docstring)."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, timeout=60)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        """Closes the database."""
        self.db.close()

    # ------------------------------------------------------------------ meta
    def get(self, key: str, default=None):
        """Returns the JSON value stored under ``key`` in the meta table, or ``default``."""
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def put(self, key: str, value) -> None:
        """Stores a JSON value under ``key`` (inside the caller's transaction)."""
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    @property
    def epoch(self) -> int:
        """The last epoch whose records were published (0: none yet)."""
        return int(self.get("epoch", 0))

    @property
    def carry(self) -> list[str]:
        """The gfids the next cut looks at again (changes a changelog may not log twice, deferred directories)."""
        return list(self.get("carry", []))

    # ------------------------------------------------------------------ nodes
    def known(self, gfids) -> dict[str, Known]:
        """Returns the published state of each of ``gfids`` that exists."""
        out: dict[str, Known] = {}
        ids = list(dict.fromkeys(gfids))
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            for g, t, b, s, x in self.db.execute(
                f"SELECT gfid, type, brick, size, xattrs FROM node WHERE gfid IN ({marks})", chunk
            ):
                out[g] = Known(gfid=g, type=t, brick=b, size=s, xattrs=json.loads(x))
            for p, n, g in self.db.execute(f"SELECT pgfid, name, gfid FROM name WHERE gfid IN ({marks})", chunk):
                if g in out:
                    out[g].names.append((p, n))
        for k in out.values():
            k.names.sort()
        return out

    def holders(self, names) -> dict[tuple[str, str], str]:
        """Returns ``{(pgfid, name): gfid}`` for those of ``names`` a published gfid holds."""
        out = {}
        pairs = list(dict.fromkeys(names))
        for i in range(0, len(pairs), 400):
            chunk = pairs[i : i + 400]
            # a join on the primary key (a row-value IN over VALUES scans the table)
            values = ",".join("(?, ?)" for _ in chunk)
            for p, n, g in self.db.execute(
                f"SELECT n.pgfid, n.name, n.gfid FROM (VALUES {values}) AS v "
                "CROSS JOIN name AS n ON n.pgfid = v.column1 AND n.name = v.column2",
                [x for pair in chunk for x in pair],
            ):
                out[(p, n)] = g
        return out

    def set_node(self, k: Known) -> None:
        """Records ``k`` as published (its names replace the ones it had)."""
        self.update([k], [])

    def drop_node(self, gfid: str) -> None:
        """Forgets a gfid the published records removed."""
        self.update([], [gfid])

    def update(self, nodes: list[Known], dropped: list[str]) -> None:
        """Records each of ``nodes`` as published (its names replace the ones it had; a name another
        one of them held goes to the later one) and forgets ``dropped``: one statement per table,
        not three per gfid. Every gfid's old names go first, so the outcome is that of
        :meth:`set_node` and :meth:`drop_node` called one gfid at a time in this order."""
        if dropped:
            self.db.executemany("DELETE FROM node WHERE gfid = ?", [(g,) for g in dropped])
        self.db.executemany("DELETE FROM name WHERE gfid = ?", [(g,) for g in dropped] + [(k.gfid,) for k in nodes])
        self.db.executemany(
            "INSERT OR REPLACE INTO node (gfid, type, brick, size, xattrs) VALUES (?, ?, ?, ?, ?)",
            [(k.gfid, k.type, k.brick, k.size, json.dumps(sorted(k.xattrs))) for k in nodes],
        )
        self.db.executemany(
            "INSERT OR REPLACE INTO name (pgfid, name, gfid) VALUES (?, ?, ?)",
            [(p, n, k.gfid) for k in nodes for p, n in k.names],
        )

    def release_names(self, names) -> None:
        """Forgets which gfid held each of ``names`` (before they are given to others)."""
        self.db.executemany("DELETE FROM name WHERE pgfid = ? AND name = ?", list(names))

    def gfids(self) -> list[str]:
        """Returns every published gfid (a cut walked whole compares each with the bricks)."""
        return [g for (g,) in self.db.execute("SELECT gfid FROM node ORDER BY gfid")]

    @property
    def halfway(self) -> list[str]:
        """The gfids the last cut held back as renames caught half-way (published at this cut as they are)."""
        return list(self.get("halfway", []))

    def count(self) -> int:
        """Returns how many gfids are published."""
        return int(self.db.execute("SELECT count(*) FROM node").fetchone()[0])

    def begin(self) -> None:
        """Starts the transaction one epoch's changes go in."""
        self.db.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        """Makes the epoch's changes durable."""
        self.db.execute("COMMIT")

    def rollback(self) -> None:
        """Drops the epoch's uncommitted changes."""
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")


def published_epoch_at(warehouse: str, source: str) -> int:
    """The last epoch whose records a cut of ``source`` published (0: none), from its state in
    ``warehouse`` (what :func:`epochsync.stages.cut.published_epoch` answers, for the layers below
    the stages)."""
    path = os.path.join(local_path(Warehouse(warehouse).cuts(source)), "state.sqlite")
    if not os.path.exists(path):
        return 0
    state = SourceState(path)
    try:
        return state.epoch
    finally:
        state.close()
