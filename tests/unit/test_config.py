import textwrap

import pytest

from epochsync.core.config import config_from_dict, load_config, parse_duration, parse_size
from epochsync.core.errors import ConfigError

GOOD = """
warehouse: file:///tmp/wh
sources:
  - name: lustre1
    root_fid: "[0x200000007:0x1:0x0]"
    servers: [MDT0000, OST0000, OST0001]
    changelogs: {uri: s3://lustre1-changelogs/, format: jsonl}
    store: {conn_id: source_s3, bucket: lustre1-data, key: "{ost}/{oid}"}
    epoch: {interval: 5m, start: 2026-01-01T00:00:00Z}
targets:
  - name: dr
    source: lustre1
    kind: s3
    conn_id: replica_s3
    bucket: replica
    prefix: lustre1/
    fileset: [/projects/cam1, /projects/cam2]
    verify: {sample: 1.0}
  - name: local
    source: lustre1
    kind: posix
    path: replica-tree
"""


def write(tmp_path, text):
    p = tmp_path / "epochsync.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_design_example_loads(tmp_path):
    cfg = load_config(write(tmp_path, GOOD))
    src = cfg.source("lustre1")
    assert src.servers == ("MDT0000", "OST0000", "OST0001")
    assert src.epoch.interval_s == 300
    assert src.changelogs.epochs_from == "records"
    dr = cfg.target("dr")
    assert (dr.kind, dr.bucket, dr.prefix, dr.fileset) == (
        "s3",
        "replica",
        "lustre1/",
        ("/projects/cam1", "/projects/cam2"),
    )
    assert cfg.target("local").path == str(tmp_path / "replica-tree")
    assert cfg.target("local").control_dir == ".epochsync"  # the default
    other = load_config(write(tmp_path, GOOD.replace("path: replica-tree", "path: t\n    control_dir: .ctl")))
    assert other.target("local").control_dir == ".ctl"
    assert cfg.warehouse == "file:///tmp/wh"


@pytest.mark.parametrize(
    "old,new,key,reason",
    [
        ("    kind: s3\n", "    kind: s3\n    colour: blue\n", "targets[0].colour", "unknown key"),
        ('    root_fid: "[0x200000007:0x1:0x0]"\n', "", "sources[0].root_fid", "missing required key"),
        ("interval: 5m", "interval: soon", "sources[0].epoch.interval", "positive duration"),
        ("sample: 1.0", "sample: 1.5", "targets[0].verify.sample", "ratio"),
        ("format: jsonl", "format: csv", "sources[0].changelogs.format", "one of jsonl, lustre, gluster"),
        ("source: lustre1\n    kind: s3", "source: nosuch\n    kind: s3", "targets[0].source", "no source named"),
        ("path: replica-tree", "path: replica-tree\n    bucket: x", "targets[1].bucket", "only s3 targets"),
        ("prefix: lustre1/", "prefix: ../escape/", "targets[0].prefix", "relative key prefix"),
        ("path: replica-tree", "path: replica-tree\n    control_dir: a/b", "targets[1].control_dir", "contains '/'"),
        ("path: replica-tree", "path: replica-tree\n    control_dir: ..", "targets[1].control_dir", "escape"),
        ("kind: s3\n", "kind: s3\n    control_dir: .epochsync-dir\n", "targets[0].control_dir", "directory marker"),
    ],
)
def test_bad_config_names_file_and_key(tmp_path, old, new, key, reason):
    assert old in GOOD
    p = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.key == key
    assert reason in e.value.reason
    assert str(e.value).startswith(str(p) + ": " + key + ": ")


def test_yaml_syntax_error_names_line(tmp_path):
    p = write(tmp_path, "sources: [\n  - name: x\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "not valid YAML" in str(e.value) and str(p) in str(e.value)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")


def test_units():
    assert parse_duration("15s") == 15 and parse_duration("1h") == 3600 and parse_duration(90) == 90
    assert parse_size("8MiB") == 8 * 1024 * 1024 and parse_size(42) == 42 and parse_size("1GB") == 10**9
    with pytest.raises(ValueError):
        parse_duration("-5m")


def test_epoch_windows():
    cfg = config_from_dict(
        {
            "sources": [
                {
                    "name": "s",
                    "root_fid": "r",
                    "servers": ["MDT0000"],
                    "changelogs": {"uri": "/tmp/x"},
                    "store": {"conn_id": "c", "bucket": "b"},
                    "epoch": {"interval": "5m", "start": "2026-01-01T00:00:00Z"},
                }
            ]
        }
    )
    ep = cfg.source("s").epoch
    start, end = ep.window(1)
    assert (end - start).total_seconds() == 300
    assert ep.epoch_of(int(start.timestamp() * 1e9)) == 1
    assert ep.epoch_of(int(end.timestamp() * 1e9)) == 2
