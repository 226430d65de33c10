"""The cut stage of a live source: make the epoch's cut, then publish its canonical records.

``cut_source(cfg, source, through)`` takes the next cuts of a ``kind: gluster`` source up to epoch
``through`` (default: the next one), each under the source's cut lock (targets and feeds
share the cuts; two callers wait for each other and the second finds its epoch done):

1. the cut (:mod:`epochsync.sources.gluster.cut`): barrier, a read-only snapshot per brick,
   barrier lifted; its record ``cuts/source=S/epoch=E.json`` says where each snapshot is;
2. each brick's changelog in the snapshot after the last cut's position
   (:mod:`epochsync.sources.gluster.changelog`), plus what the live changelogs logged in the
   instant after the snapshots (operations whose record came after the cut though their
   effect is in it: kept in the cut record, so a retry resolves the same);
3. the records resolved against the cut (:mod:`epochsync.sources.gluster.resolve`) and
   published as canonical JSON Lines, ``cuts/source=S/changelogs/<brick>/<E>.jsonl``, each
   ending with the brick's ``EPOCH`` record: that is when the epoch closes for the targets;
4. the source's state (:mod:`epochsync.sources.gluster.state`) committed last: a cut killed
   anywhere is taken (or resolved) again by the next call and publishes the same records.

A source's first cut publishes the whole volume as it is (every gfid the bricks hold), so a
target's epoch 1 is a full copy; every later epoch is what changed since the last cut.

A cut is **walked whole** instead (every gfid the bricks hold and every published one compared,
as the first cut does, against the published state) when the records cannot be trusted: a
brick's changelog lost records since the last cut (:class:`~epochsync.sources.gluster.changelog.ChangelogGap`:
two rollovers in one second at a short ``changelog.rollover-time``), cannot be read, or the live
changelogs read after the snapshots do not continue them; and when asked (``epochsync cut
--rewalk``: the way out of a cut that refuses, e.g. a brick with no position). The walk's
repairs (gfids no record named whose published state differed) are logged and kept in the cut
record (``publish.walk``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from epochsync.core.argtypes import epoch_number
from epochsync.core.config import Config, SourceConfig
from epochsync.core.errors import EpochError, SourceError
from epochsync.core.gluster import Brick, GlusterError, parse_brick_spec, run_gluster, volume_info, volume_status
from epochsync.core.schema import Record
from epochsync.sources.gluster.bricks import AgentBrick, LocalBrick
from epochsync.sources.gluster.changelog import Position
from epochsync.sources.gluster.cut import BtrfsCut
from epochsync.sources.gluster.reader import cut_record, data_bricks
from epochsync.sources.gluster.replicas import (
    ReplicaSet,
    choose_reader,
    covered,
    merge_set_records,
    owed_heals,
    quorum,
    replica_sets,
)
from epochsync.sources.gluster.resolve import Resolver, walk_gfids
from epochsync.sources.gluster.state import SourceState, published_epoch_at
from epochsync.stages.context import _config
from epochsync.warehouse.fs import fsync_dir, lock_file, read_json, write_json_atomic, write_text_atomic
from epochsync.warehouse.paths import Warehouse, local_path

#: the fields of a raw record a cut keeps of what the live changelogs logged just after it
_HINT_FIELDS = ("type", "tfid", "sfid", "pfid", "name", "spfid", "sname")
#: a published record's line: ``json.dumps(..., separators=(",", ":"))`` without a new encoder per record
_compact = json.JSONEncoder(separators=(",", ":")).encode


def gluster_source(cfg: Config, source: str | SourceConfig) -> SourceConfig:
    """Returns the source called ``source``; an EpochError when it is not a ``kind: gluster`` source."""
    src = source if isinstance(source, SourceConfig) else cfg.source(source)
    if src.kind != "gluster":
        raise EpochError(f"source {src.name} is not a live file system (kind: {src.kind}): it has no cuts")
    return src


def bricks(src: SourceConfig) -> list[Brick]:
    """Returns the source's bricks as their servers name them (brick1, brick2, ...)."""
    return [parse_brick_spec(spec, i) for i, spec in enumerate(src.bricks, start=1)]


def mechanism(src: SourceConfig) -> BtrfsCut:
    """Returns the source's cut mechanism (btrfs: the one built)."""
    cut = src.cut
    assert cut is not None and src.volume is not None
    agents = {}
    if src.agents:
        from epochsync.stores.connections import resolve_agent

        assert src.agent_conn_id is not None
        settings = resolve_agent(src.agent_conn_id)
        urls = dict(src.agents)
        clients = {url: settings.client(url) for url in urls.values()}
        agents = {b.name: clients[urls[b.host]] for b in bricks(src)}
    return BtrfsCut(
        src.name,
        src.volume,
        bricks(src),
        cut.snapshots,
        barrier=cut.barrier,
        timeout=cut.timeout_s,
        bricks_here=cut.bricks_here,
        command=src.gluster_commands,
        agents=agents,
    )


def sets_of(src: SourceConfig) -> list[ReplicaSet] | None:
    """The replica sets of a replicated source (its servers), None for a distribute one."""
    if src.replica <= 1:
        return None
    return replica_sets([b.name for b in bricks(src)], src.replica, src.arbiter)


def cuts_dir(cfg: Config, source: str) -> str:
    """Returns the local folder of ``source``'s cuts."""
    return local_path(Warehouse(cfg.warehouse).cuts(source))


def read_cut(cfg: Config, source: str, epoch: int) -> dict | None:
    """Returns the record of ``source``'s cut ``epoch``, or None when it was never taken."""
    return cut_record(cfg.warehouse, source, epoch)


def cut_epochs(cfg: Config, source: str) -> list[int]:
    """Returns the epochs whose cut records exist, oldest first."""
    d = cuts_dir(cfg, source)
    out = []
    if os.path.isdir(d):
        for name in os.listdir(d):
            if name.startswith("epoch=") and name.endswith(".json"):
                try:
                    out.append(int(name[6:-5]))
                except ValueError:
                    continue
    return sorted(out)


def published_epoch(cfg: Config, source: str) -> int:
    """The last epoch whose records a cut published (0: none)."""
    return published_epoch_at(cfg.warehouse, source)


# --------------------------------------------------------------------------- the stage


def cut_source(
    cfg,
    source: str,
    through: int | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    rewalk: bool = False,
) -> dict:
    """Take ``source``'s cuts up to ``through`` (default: the next one); returns the figures of each.
    ``rewalk``: the first of them is walked whole (see the module docstring)."""
    cfg = _config(cfg)
    src = gluster_source(cfg, source)
    say = progress or (lambda _line: None)
    folder = cuts_dir(cfg, src.name)
    os.makedirs(folder, exist_ok=True)
    done: list[dict] = []
    with lock_file(os.path.join(folder, "cut.lock")):
        state = SourceState(os.path.join(folder, "state.sqlite"))
        try:
            last = state.epoch
            goal = last + 1 if through is None else through
            if goal <= last:
                return {"source": src.name, "noop": True, "epoch": last, "message": f"cut {goal} is taken already"}
            mech = mechanism(src)
            write_json_atomic(
                os.path.join(folder, "volume.json"),
                {"volume": src.volume, "bricks": list(src.bricks), "replica": src.replica, "arbiter": src.arbiter},
            )
            for epoch in range(last + 1, goal + 1):
                done.append(_cut_one(cfg, src, mech, state, epoch, say, rewalk=rewalk and epoch == last + 1))
        finally:
            state.close()
    return {"source": src.name, "epoch": done[-1]["epoch"], "cuts": done}


def _fault_point(cfg: Config, source: str, epoch: int):
    """``tick(what)`` at the cut's steps (``stage=cut`` of :mod:`epochsync.journal.faults`): 1 after the
    snapshots, 2 after the records are published; a no-op unless a spec names the cut."""
    from epochsync.journal.faults import FaultCounter, resolve

    spec = resolve(None)
    if spec is None or not spec.applies(source, epoch, "cut"):
        return lambda what: None
    folder = cuts_dir(cfg, source)
    counter = os.path.join(folder, f"faults-cut-{epoch}.count")
    if os.path.exists(counter):
        os.remove(counter)
    return FaultCounter(spec, counter, os.path.join(folder, f"fault-cut-{epoch}.fired")).tick


def _cut_one(
    cfg: Config, src: SourceConfig, mech: BtrfsCut, state: SourceState, epoch: int, say, *, rewalk: bool = False
) -> dict:
    wh = Warehouse(cfg.warehouse)
    path = local_path(wh.cut(src.name, epoch))
    fault = _fault_point(cfg, src.name, epoch)
    record = read_json(path)
    first = state.epoch == 0
    if record is None or not all(
        where.get("missing") or _side(mech, name, where).exists() for name, where in record["bricks"].items()
    ):
        say(f"cut {epoch} of {src.name}: barrier and snapshots of {len(src.bricks)} bricks")
        rsets = sets_of(src)
        # a replicated volume is cut without a server whose agent is out of reach: its sets' other
        # bricks hold what it does (the readers are chosen among the bricks cut)
        cuts, figures = mech.take(epoch, may_miss=bool(rsets))
        live_paths = {b.name: b.path for b in mech.bricks}
        record = {
            "source": src.name,
            "volume": src.volume,
            "epoch": epoch,
            "time_ns": figures["time_ns"],
            "bricks": {
                c.brick: (
                    {"missing": c.missing, "live": live_paths[c.brick]}
                    if c.missing
                    else {"snapshot": c.snapshot, "root": c.root, "live": live_paths[c.brick]}
                    | ({"agent": c.agent} if c.agent else {})
                )
                for c in cuts
            },
            "cut": figures,
            "resolved": False,
        }
        for c in cuts:
            if c.missing:
                say(
                    f"cut {epoch} of {src.name}: {c.brick} not cut ({c.missing}); its set is read through another brick"
                )
        if rsets:
            _choose_readers(cfg, src, mech, rsets, record, epoch)
        record["hints"], failed = _hints(record, first, mech)
        failed = _uncovered(failed, rsets, record)
        if failed:
            record["hints_failed"] = "; ".join(f"{b}: {w}" for b, w in sorted(failed.items()))
        write_json_atomic(path, record)
        say(
            f"cut {epoch} of {src.name}: barrier on {figures['barrier_on_s']:.2f} s, snapshots {figures['snapshots_s']:.3f} s, "
            f"off {figures['barrier_off_s']:.2f} s"
            + (f"; namespace operations held {figures['held_s']:.2f} s" if "held_s" in figures else "")
        )
    fault("snapshots taken")
    t0 = time.monotonic()
    rsets = sets_of(src)
    readers = data_bricks(record)
    views = [_side(mech, readers[b], record["bricks"][readers[b]], name=b) for b in src.servers]
    prev_rec = read_cut(cfg, src.name, epoch - 1) if epoch > 1 else None
    prev = None
    if rsets and prev_rec and prev_rec.get("sets"):
        # a set is compared with its last cut only through the same reader (module docstring of replicas)
        prev = [
            old
            for s in rsets
            if (r := record["sets"][s.name]["reader"]) == prev_rec["sets"].get(s.name, {}).get("reader")
            and (old := _side(mech, r, prev_rec["bricks"][r], name=s.name)).exists()
        ]
    elif not rsets and prev_rec:
        olds = [_side(mech, b, prev_rec["bricks"][b]) for b in src.servers]
        prev = olds if all(o.exists() for o in olds) else None
    positions = state.get("positions", {})
    raw: list[Record] = []
    live: list[Record] = []
    new_positions: dict[str, dict] = {}
    files_read = 0
    # why this cut is walked whole (nothing: its records are trusted)
    walk: dict[str, str] = {}
    if rewalk and not first:
        walk["asked"] = "epochsync cut ... --rewalk"
    if record.get("hints_failed") and not first:
        walk["hints"] = record["hints_failed"]
    per_brick: dict[str, list[Record]] = {}
    unread: dict[str, Exception] = {}
    for name in record["bricks"] if rsets else src.servers:
        if record["bricks"][name].get("missing"):
            # not cut: its records are its set's other bricks' (the set is covered, or no reader was
            # chosen); it reads on from where it was when it is cut again
            unread[name] = EpochError(f"{name} was not cut ({record['bricks'][name]['missing']})")
            per_brick[name] = []
            if name in positions:
                new_positions[name] = positions[name]
            continue
        side = _side(mech, name, record["bricks"][name])
        if first:
            end, end_live = side.changelog_end()
            new_positions[name] = end.to_dict()
            live.extend(end_live)
            continue
        at = positions.get(name)
        try:
            if at is None:
                raise EpochError(f"source {src.name}: the state has no changelog position of {name} (a brick added?)")
            sl = side.changelog_slice(Position.from_dict(at))
        except (GlusterError, EpochError, OSError) as exc:
            unread[name] = exc
            # the records read are incomplete: the walk (or the set's other bricks) has the rest; the
            # next cut reads on from the end of what this snapshot holds
            per_brick[name] = side.changelog_readable(at)
            end, end_live = side.changelog_end()
            new_positions[name] = end.to_dict()
            live.extend(end_live)
            continue
        per_brick[name] = sl.records
        live.extend(sl.live)
        files_read += len(sl.files)
        new_positions[name] = sl.position.to_dict()
    q = int(record.get("quorum", 1))
    for name, failure in unread.items():
        rset = next((r for r in rsets or () if name in r.bricks), None)
        if rset is not None and covered(rset, set(unread) & set(rset.bricks), q):
            say(
                f"cut {epoch} of {src.name}: {name}'s changelog could not be read ({failure}); the other bricks "
                f"of {rset.name} hold its records"
            )
            continue
        if not walk and not rewalk and isinstance(failure, EpochError):
            raise EpochError(
                f"{failure}; the cut is sound: 'epochsync cut --config {cfg.file} --source {src.name} --rewalk' publishes it by walking "
                "it whole against the published state"
            ) from None
        walk[name] = str(failure)
    if rsets:
        for rset in rsets:
            reader = record["sets"][rset.name]["reader"]
            order = [reader, *(b for b in rset.bricks if b != reader)]
            raw.extend(merge_set_records([per_brick.get(b, []) for b in order]))
    else:
        for name in src.servers:
            raw.extend(per_brick.get(name, []))
    for h in record.get("hints") or []:
        h = dict(h)
        raw.append(Record(server="", index=0, epoch=epoch, type=h.pop("type", "HINT"), **h))
    everything: list[str] = []
    if first:
        everything = walk_gfids(views)
    elif walk:
        for why, what in sorted(walk.items()):
            say(f"cut {epoch} of {src.name}: walked whole against the published state ({why}: {what})")
        everything = sorted(set(walk_gfids(views)) | set(state.gfids()))
    time_ns = int(record["time_ns"])
    state.begin()
    try:
        resolver = Resolver(state, views, prev, epoch, time_ns)
        resolved = resolver.resolve(raw, state.carry, everything, check_links=not first)
        # a changelog logs a gfid's data (and attribute) change once per rollover window: what
        # the live file logged before the cut may change again after it without a new record
        carry = set(resolved.carry) | {r.tfid for r in live if r.tfid and r.type in ("WRITE", "SATTR", "XATTR")}
        next_index = dict(state.get("next_index", {}))
        counts = {}
        out_dir = local_path(wh.cut_changelogs(src.name))
        for brick in src.servers:
            recs = resolved.records.get(brick, [])
            n = int(next_index.get(brick, 1))
            lines = []
            for r in recs:
                r.index = n
                n += 1
                lines.append(_compact(r.to_dict()))
            lines.append(_compact(Record(server=brick, index=n, epoch=epoch, type="EPOCH", time_ns=time_ns).to_dict()))
            next_index[brick] = n + 1
            counts[brick] = len(recs)
            # durable before the state that says this epoch is published commits (a crash in
            # between must not leave a published epoch whose records never reached the disk)
            write_text_atomic(
                os.path.join(out_dir, brick, f"{epoch:010d}.jsonl"), "\n".join(lines) + "\n", durable=True
            )
            fsync_dir(os.path.join(out_dir, brick))
        fault("records published")
        state.put("positions", new_positions)
        state.put("next_index", next_index)
        state.put("carry", sorted(g for g in carry if g))
        state.put("halfway", resolved.halfway)
        state.put("epoch", epoch)
        state.commit()
    except BaseException:
        state.rollback()
        raise
    figures = dict(resolved.figures)
    figures.update(
        {
            "records": counts,
            "raw_records": len(raw),
            "changelog_files": files_read,
            "carried": len(carry),
            "resolve_s": round(time.monotonic() - t0, 4),
            "first": first,
        }
    )
    if walk:
        figures["walk"] = {"why": walk, "repaired": len(resolved.repaired), "repaired_gfids": resolved.repaired[:50]}
        say(
            f"cut {epoch} of {src.name}: the walk repaired {len(resolved.repaired)} gfids the records did not name"
            + (f" (first: {', '.join(resolved.repaired[:5])})" if resolved.repaired else "")
        )
    if resolved.halfway:
        say(
            f"cut {epoch} of {src.name}: {len(resolved.halfway)} renames caught half-way held back to the next cut: "
            + ", ".join(resolved.halfway[:5])
        )
    record["resolved"] = True
    record["publish"] = figures
    # what keeps its published state past this cut (split directory operations, renames caught
    # half-way, what waits for its parent): the audit leaves them out of its comparison
    record["held"] = sorted(resolved.carry)
    write_json_atomic(path, record)
    say(
        f"cut {epoch} of {src.name}: {sum(counts.values())} records published from {len(raw)} raw ones "
        f"({figures['touched']} gfids looked at) in {figures['resolve_s']:.2f} s"
    )
    return {"epoch": epoch, "cut": record["cut"], "publish": figures}


def _choose_readers(cfg: Config, src: SourceConfig, mech: BtrfsCut, rsets: list[ReplicaSet], record: dict, epoch: int):
    """Records in a replicated source's new cut each set's reader, the bricks' state and the quorum
    (:mod:`epochsync.sources.gluster.replicas`); an EpochError when a set has no brick to read.

    Gluster is asked through ``gluster_command``, then its fallbacks: one that gets no answer is
    passed over, and so is one whose glusterd answers from a minority of its pool (a server cut
    off from the others says their bricks are down) when the readers it gives cannot be chosen."""
    commands = src.gluster_commands
    for i in range(len(commands)):
        try:
            return _choose_readers_via(cfg, src, mech, rsets, record, epoch, commands[i:])
        except EpochError as exc:
            hint = _minority_hint(commands[i])
            if hint and i + 1 < len(commands):
                continue  # that server is cut off from most of its pool: ask the next one
            raise EpochError(f"{exc}{hint}") from None
    raise AssertionError("unreachable: a source has at least one gluster command")


def _choose_readers_via(
    cfg: Config,
    src: SourceConfig,
    mech: BtrfsCut,
    rsets: list[ReplicaSet],
    record: dict,
    epoch: int,
    command: tuple[tuple[str, ...], ...],
):
    assert src.volume is not None  # a gluster source's (config)
    volume = src.volume
    names = [b.name for b in mech.bricks]
    index_of = {b: i for i, b in enumerate(names)}
    spec_of = {b.name: b.spec for b in mech.bricks}
    # Gluster's two answers at once: each is a CLI run of about 0.1 s, most of a cut without barrier
    with ThreadPoolExecutor(max_workers=2) as ask:
        status = ask.submit(volume_status, volume, command=command)
        info = ask.submit(volume_info, volume, command=command)
    online_by_spec = status.result()
    online = None if online_by_spec is None else {b: online_by_spec.get(spec_of[b], False) for b in names}
    try:
        record["quorum"] = quorum(src.replica, info.result()["options"])
    except GlusterError:
        record["quorum"] = 1  # unknown: an operation may be on one brick only
    sides = {b: _side(mech, b, record["bricks"][b]) for b in names if not record["bricks"][b].get("missing")}
    if online is not None:
        # a brick that was not cut is no reader, whatever glusterd says of it
        online = {b: up and b in sides for b, up in online.items()}
    elif len(sides) < len(names):
        online = {b: b in sides for b in names}
    owed_now = owed_heals(list(sides.values()), volume, index_of)
    prev = read_cut(cfg, src.name, epoch - 1) if epoch > 1 else None
    started = {b: _started(sides[b]) if b in sides else None for b in names}
    record["status"] = online
    record["owed"] = owed_now
    record["sets"] = {}
    for rset in rsets:
        verdict = choose_reader(
            rset,
            previous=((prev or {}).get("sets") or {}).get(rset.name, {}).get("reader"),
            online=online,
            owed_now=owed_now,
            owed_before=(prev or {}).get("owed") or {},
            started=started,
            last_cut_s=prev["time_ns"] / 1e9 if prev else None,
            source=src.name,
            epoch=epoch,
        )
        record["sets"][rset.name] = {
            "bricks": list(rset.bricks),
            "arbiter": rset.arbiter,
            "reader": verdict.reader,
            "not_reader": verdict.refused,
        }


def _minority_hint(command: tuple[str, ...]) -> str:
    """When the glusterd ``command`` reaches sees fewer than half of its pool (a server cut off from
    the others, which says their bricks are down), the words that say so; else nothing."""
    try:
        out = run_gluster(["pool", "list"], timeout=30, command=command)
    except GlusterError:
        return ""
    peers = [line for line in out.splitlines()[1:] if line.strip()]
    seen = sum(1 for line in peers if line.split()[-1:] == ["Connected"])
    if peers and seen * 2 <= len(peers):
        return (
            f" (the glusterd that answered sees {seen} of the {len(peers)} servers of its pool: it may be cut "
            "off from the others; point gluster_command at a server in the majority, or add the others as "
            "gluster_fallbacks)"
        )
    return ""


def _uncovered(failed: dict[str, str], rsets: list[ReplicaSet] | None, record: dict) -> dict[str, str]:
    """The bricks whose hints could not be read and whose set's other bricks do not make up for them
    (every one of a distribute source)."""
    if not failed or not rsets:
        return failed
    q = int(record.get("quorum", 1))
    out = {}
    for rset in rsets:
        missing = set(failed) & set(rset.bricks)
        if missing and not covered(rset, missing, q):
            out.update({b: failed[b] for b in missing})
    return out


def _hints(record: dict, first: bool, mech: BtrfsCut | None = None) -> tuple[list[dict], dict[str, str]]:
    """What the live changelogs logged right after the snapshots: operations whose effect the cut
    holds though their record was written after it (a record is written once the operation is
    done). Read now, kept in the cut record, so resolving again gives the same records. Returns
    them (each distinct one once: replicas log the same operations), and why a brick's could not be
    read (then the cut is walked whole unless the brick's set is covered without it: the snapshots
    are sound, only the hints are missing)."""
    if first:
        return [], {}
    out = []
    seen: set[tuple] = set()
    failed: dict[str, str] = {}
    for brick, where in sorted(record["bricks"].items()):
        if where.get("missing"):
            failed[brick] = f"not cut ({where['missing']})"
            continue
        try:
            recs = _side(mech, brick, where).hints()
        except (GlusterError, EpochError, OSError) as exc:
            failed[brick] = str(exc)
            continue
        for r in recs:
            h = {f: getattr(r, f) for f in _HINT_FIELDS if getattr(r, f)}
            key = tuple(sorted(h.items()))
            if key not in seen:
                seen.add(key)
                out.append(h)
    return out, failed


def _live_brick_root(where: dict) -> str | None:
    """The live brick directory of a brick's cut (the hints are read there)."""
    return where.get("live")


def _started(side: LocalBrick | AgentBrick) -> int | None:
    """When the brick's changelog last (re)started (None: unknown, its agent out of reach)."""
    try:
        return side.started()
    except SourceError:
        return None


def _side(mech: BtrfsCut | None, brick: str, where: dict, *, name: str | None = None) -> LocalBrick | AgentBrick:
    """Brick ``brick`` of a cut as the cut record's ``where`` says it was taken: through the agent of
    its server (``where["agent"]``), or at its path here. ``name``: what the resolver calls it (a
    replicated volume's set, read through this brick)."""
    agent = where.get("agent")
    if not agent:
        return LocalBrick(name or brick, where["root"], _live_brick_root(where))
    client = mech.agents.get(brick) if mech is not None else None
    if client is None:
        raise EpochError(
            f"brick {brick}'s cut was taken by the agent at {agent['url']}, but the source names no agent for its "
            "server now (sources[].agents)"
        )
    return AgentBrick(name or brick, client, agent["brick"], agent["snapshot"])


# --------------------------------------------------------------------------- the verb


def configure_cut(parser) -> None:
    """Add the ``cut`` verb's options to ``parser``."""
    parser.add_argument("--config", required=True, metavar="FILE", help="epochsync YAML config")
    parser.add_argument("--source", required=True, metavar="NAME", help="the live source (kind: gluster) to cut")
    parser.add_argument(
        "--through", type=epoch_number, metavar="E", help="take every cut up to epoch E (default: the next one)"
    )
    parser.add_argument(
        "--rewalk",
        action="store_true",
        help="walk the next cut whole against the published state instead of trusting the changelogs (the way "
        "out of a cut that refuses, e.g. a brick with no changelog position; every gfid is looked up, as at a first cut)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON document")


def run_cut(args) -> int:
    """The ``cut`` verb: progress lines, then one line per cut (or ``--json``); returns 0."""
    from epochsync.core.config import load_config

    cfg = load_config(args.config)
    out = cut_source(
        cfg,
        args.source,
        args.through,
        progress=None if args.json else (lambda line: print(line, flush=True)),
        rewalk=args.rewalk,
    )
    if args.json:
        print(json.dumps(out, indent=1, sort_keys=True))
        return 0
    if out.get("noop"):
        print(f"source {out['source']}: {out['message']}; nothing to do")
        return 0
    for c in out["cuts"]:
        cut, pub = c["cut"], c["publish"]
        print(
            f"epoch {c['epoch']}: cut in {cut['total_s']:.2f} s (barrier on {cut['barrier_on_s']:.2f} s, snapshots "
            f"{cut['snapshots_s']:.3f} s, off {cut['barrier_off_s']:.2f} s"
            + (f"; namespace operations held {cut['held_s']:.2f} s" if "held_s" in cut else "")
            + f"); {sum(pub['records'].values())} records published in {pub['resolve_s']:.2f} s"
        )
    return 0
