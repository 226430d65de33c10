"""Config files of the simulated source the stage tests share."""

from __future__ import annotations

from pathlib import Path

from epochsync_dev.simulate.workload import ROOT_FID


def sim_config(tmp: Path, targets: list[dict]) -> Path:
    """Write ``tmp/epochsync.yaml``: the simulator's source ``sim`` (2 MDTs, 2 OSTs, JSON Lines
    changelogs under ``tmp/changelogs``, a warehouse under ``tmp/warehouse``) and ``targets``
    (each a flow mapping's keys and values; ``source: sim`` is added). Returns its path."""
    lines = []
    for t in targets:
        keys = ", ".join(f"{k}: {v}" for k, v in {"source": "sim", **t}.items())
        lines.append(f"  - {{{keys}}}")
    cfg = tmp / "epochsync.yaml"
    cfg.write_text(
        f"""
warehouse: file://{tmp}/warehouse
sources:
  - name: sim
    root_fid: "{ROOT_FID}"
    servers: [MDT0000, MDT0001, OST0000, OST0001]
    changelogs: {{uri: file://{tmp}/changelogs, format: jsonl}}
    store: {{conn_id: source_s3, bucket: sim}}
    epoch: {{interval: 5m, start: 2026-01-01T00:00:00Z}}
targets:
"""
        + "\n".join(lines)
        + "\n"
    )
    return cfg
