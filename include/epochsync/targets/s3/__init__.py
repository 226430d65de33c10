"""The ``s3`` target.

Layout (DESIGN section 4): one object per path under ``prefix`` (hard links: one object
per path), symlinks and special files as empty objects whose metadata says what they
are. A directory is the empty object :func:`dir_key` in the control area (layout 2, see
:data:`LAYOUT`), where no source name can collide with it; a replica written before
layout 2 kept it at ``path/.epochsync-dir`` and is moved by :meth:`S3Target.upgrade_layout`.
Attributes and xattrs live in object
metadata (``x-amz-meta-es-*``). A striped target (``stripe_size``/``stripe_count``)
keeps a small head object per path and the file's bytes in stripe objects per fid
under ``.epochsync/stripes/`` (RAID-0 with the target's own geometry), so a rename or
a hard link copies only the head.

The bucket is versioned. Every mutation is journaled first with the set of versions
the key had (from the write fence's listing); undo deletes every version of the key
that is not in that set, which restores the previous state with no data copied, and
is idempotent. A key written whole on a store that honours conditional writes is not
listed: its write carries the fence (``If-Unmodified-Since`` the fence instant, or
``If-None-Match: *``), and its entry names that instant instead; undo deletes the
versions written after it. Started multipart uploads are journaled and aborted by a rollback.

The modules, one concern each: :mod:`~epochsync.targets.s3.naming` (the keys of paths,
directories, stripes and sidecars), :mod:`~epochsync.targets.s3.meta` (attributes as object
metadata), and the target class built up in a chain, :mod:`~epochsync.targets.s3.control`
(bucket, manifest, lease place, fence instant), :mod:`~epochsync.targets.s3.versions`
(version listings, the write fence's check), :mod:`~epochsync.targets.s3.reads`,
:mod:`~epochsync.targets.s3.writes`, :mod:`~epochsync.targets.s3.undo` and
:mod:`~epochsync.targets.s3.target`. The S3 client they share is
:class:`epochsync.stores.s3_access.S3Access`.
"""

from epochsync.targets.s3.meta import META_LIMIT, attrs_sidecar, decode_meta, encode_meta
from epochsync.targets.s3.naming import (
    LEGACY_DIR_OBJECT,
    attrs_key,
    dir_key,
    dir_path_of,
    key_for,
    listed_key_is,
    path_of_key,
    stripe_key,
)
from epochsync.targets.s3.target import S3Target

__all__ = [
    "LEGACY_DIR_OBJECT",
    "META_LIMIT",
    "S3Target",
    "attrs_key",
    "attrs_sidecar",
    "decode_meta",
    "dir_key",
    "dir_path_of",
    "encode_meta",
    "key_for",
    "listed_key_is",
    "path_of_key",
    "stripe_key",
]
