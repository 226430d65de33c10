"""The warehouse: paths, file operations without a JVM, snapshots and the target's event log."""
