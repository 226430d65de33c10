"""Live file systems as sources: where a source's records and bytes come from when they are not
files of changelog records and objects in a bucket.

``sources/gluster/``: a GlusterFS volume, cut at every epoch boundary (Gluster's barrier and a
read-only snapshot of every brick), its bricks' own changelogs turned into canonical records by
comparing each cut with the last (:mod:`epochsync.sources.gluster.resolve`), and its bytes read
from the epoch's brick snapshots (:mod:`epochsync.sources.gluster.reader`).
"""
