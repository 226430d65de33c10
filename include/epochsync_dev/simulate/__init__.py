"""The source simulator: a seeded random workload → changelogs, stripe objects, ground truth.

Two entry points, one engine (:class:`Workload`):

``simulate_history(seed, epochs, files, ...) -> History`` (in memory, no S3; for property tests)
    ``History.epochs[i]`` (epoch ``i+1``) has ``records`` (every server's records in true
    order, each server's ``EPOCH`` record at the end), ``truth`` (ground-truth rows, see
    below), ``contents`` (``{fid: bytes}`` of every file), ``snapshot`` (the oracle's snapshot
    rows, :mod:`epochsync_dev.oracle` format) at the end of the epoch. ``History.snapshot_before(E)``
    is snapshot E-1 (epoch 0: the root alone). Object versions are fake (``v<n>``).

``python -m epochsync_dev simulate --out DIR ...`` (the CLI verb) writes the layout of docs/INTERNALS.md
"Simulator output": ``DIR/changelogs/<server>/<EEEEEE>.jsonl``, ``DIR/truth/epoch=E.jsonl``,
``DIR/snapshot/epoch=E/part-0.jsonl``, ``DIR/epochsync.yaml``, and the file data in a
versioned S3 bucket (``WRITE`` records carry the real ``VersionId``). ``--no-data`` writes
records only, with fake versions, streaming (for merge benchmarks of millions of records).

Examples::

    # a demo source: 2 MDTs, 4 OSTs, 2000 files, 6 epochs, data in a versioned bucket
    export AIRFLOW_CONN_SOURCE_S3='{"conn_type": "aws", "login": "KEY", "password": "SECRET",
                                    "extra": {"endpoint_url": "http://127.0.0.1:8333"}}'
    python -m epochsync_dev simulate --out var/sim --seed 1 --epochs 6 --files 2000 --mdts 2 --osts 4
    # a merge benchmark input: records only, an epoch of 10 million records, 70% WRITE
    python -m epochsync_dev simulate --out var/bench --no-data --epochs 2 --files 100000 --records-per-epoch 10000000 --write-share 0.7

The source being simulated: MDTs ``MDT0000..`` and OSTs ``OST0000..``; root fid
:data:`ROOT_FID`; Lustre-like fids ``[0x<seq>:0x<n>:0x0]`` with one sequence per MDT.
Namespace and attribute records go to the MDT owning the parent directory (entry
operations) or the fid (attribute operations); a directory lives on a random MDT. Regular
files get a RAID-0 layout (stripe size 4/16/64 KiB, 1-4 objects ``{ost, oid}`` with key
``{ost}/{oid}``) or, with ``unstriped_ratio``, none: the file is then one object
``data/{fid}`` whose ``WRITE`` records name ``{ost: <the OST that logs it>, oid: <fid>}``
with file offsets. Every write logs one ``WRITE`` per object touched (object offsets, the
object's version after the write), sometimes then an ``MTIME`` on the MDT; the records of
one operation that span several servers share a ``cookie`` (``op-<n>``). A truncate that shrinks an
object re-stores it and logs a ``WRITE`` without extents carrying the new version, so the
latest version of an object in an epoch never holds bytes past the file's size (a pull of
``[min size, final size)`` reads zeros, not stale bytes). The objects a file loses with its
last link are deleted (a delete marker; old versions stay readable). Every record gets a
strictly increasing ``time_ns`` inside its epoch's window (``2026-01-01T00:00:00Z`` + 5 min
per epoch), so time order is the true order; per-server indexes start at 1 and have no gap.

Ground-truth rows (``truth``), one per path, sorted by path: ``path`` (relative to the
root, no leading ``/``), ``type`` (file, dir, symlink, other), ``size`` (files; None
otherwise), ``sha256`` (files, hex; None with ``--no-data``), ``mode`` (st_mode with the
type bits), ``uid``, ``gid``, ``symlink`` (target), ``xattrs`` (``{name: base64 value}``),
plus ``fid`` and ``mtime_ns``. Hard links appear once per path.
"""
