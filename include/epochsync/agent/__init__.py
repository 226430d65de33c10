"""The epochsync agent: the one process of epochsync that runs on a Gluster server, next to its bricks.

It does what needs the bricks and root, so the Airflow workers and Spark executors need neither:
takes that server's brick snapshots at a cut (a read-only btrfs snapshot per brick), purges them,
and serves, from those snapshots only, what the pipeline reads: a file's attributes, xattrs,
FIEMAP extents and byte ranges by gfid, and the changelog files. :mod:`.server` is the agent,
:mod:`.client` the pipeline's side, :mod:`.protocol` what both agree on (requests, the secret's
signature, the errors), :mod:`.cli` the ``epochsync agent`` verbs.
"""
