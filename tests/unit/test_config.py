import dataclasses
import json
import textwrap
from pathlib import Path

import jsonschema
import pytest
import yaml

from epochsync.core.config import (
    Config,
    EpochConfig,
    TargetConfig,
    config_from_dict,
    load_config,
    main,
)
from epochsync.core.config_values import parse_duration, parse_size
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
        ("sample: 1.0", "sample: 1.0, contents: some", "targets[0].verify.contents", "one of changed, full"),
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


def load_error(tmp_path, text) -> ConfigError:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value).startswith(f"{p}: {e.value.key}: "), "one line: file, key path, reason"
    assert "\n" not in str(e.value) and "pydantic" not in str(e.value), "never pydantic's own report"
    return e.value


@pytest.mark.parametrize(
    "old,new,key,reason",
    [
        # an unknown key, at the top and nested, names itself and the keys that exist there
        (
            "warehouse:",
            "colour: blue\nwarehouse:",
            "colour",
            "unknown key (known keys here: sources, spark, targets, warehouse)",
        ),
        (
            "start: 2026",
            "zone: UTC, start: 2026",
            "sources[0].epoch.zone",
            "unknown key (known keys here: interval, start)",
        ),
        ("bucket: replica\n", "buckit: replica\n", "targets[0].buckit", "did you mean 'bucket'?"),
        # the Python name of a key is not its name in the file
        ("interval: 5m", "interval_s: 300", "sources[0].epoch.interval_s", "did you mean 'interval'?"),
        # wrong types, with the key path down to a list item
        (
            "servers: [MDT0000, OST0000, OST0001]",
            "servers: MDT0000",
            "sources[0].servers",
            "expected a list, got a string",
        ),
        ("OST0000, OST0001]", "OST 0000, OST0001]", "sources[0].servers[1]", "expected a name of letters"),
        ("verify: {sample: 1.0}", "verify: all", "targets[0].verify", "expected a mapping, got a string"),
        (
            "prefix: lustre1/",
            "prefix: lustre1/\n    stripe_size: lots\n    stripe_count: 2",
            "targets[0].stripe_size",
            "expected a byte size like 1048576 or 8MiB, got 'lots'",
        ),
        (
            "prefix: lustre1/",
            "prefix: lustre1/\n    stripe_size: 1MiB",
            "targets[0].stripe_count",
            "needs both stripe_size and stripe_count",
        ),
        (
            "prefix: lustre1/",
            "prefix: lustre1/\n    max_attempts: '3'",
            "targets[0].max_attempts",
            "expected a whole number from 1 to 100, got '3'",
        ),
        (
            "fileset: [/projects/cam1, /projects/cam2]",
            "fileset: [/projects/cam1, projects]",
            "targets[0].fileset[1]",
            "absolute paths",
        ),
        ("path: replica-tree", "path: replica-tree\n    part_size: 1MiB", "targets[1].part_size", "at least 5 MiB"),
        # the kind of a target decides its keys
        ("    kind: s3\n", "", "targets[0].kind", "missing required key"),
        ("kind: s3", "kind: nfs", "targets[0].kind", "expected one of s3, posix, feed, got 'nfs'"),
        ("kind: posix\n    path: replica-tree", "kind: posix", "targets[1].path", "missing required key"),
        ("path: replica-tree", "path: replica-tree\n    stripe_count: 2", "targets[1].stripe_count", "only s3 targets"),
        (
            "path: replica-tree",
            "path: replica-tree\n    engine: local",
            "targets[1].engine",
            "removed: Spark is the only engine",
        ),
        (
            "kind: posix\n    path: replica-tree",
            "kind: feed",
            "targets[1].path",
            "a feed needs a directory (path) or an S3 prefix",
        ),
        (
            "kind: posix\n    path: replica-tree",
            "kind: feed\n    path: f\n    bucket: b",
            "targets[1].bucket",
            "not both",
        ),
        (
            "kind: posix\n    path: replica-tree",
            "kind: feed\n    path: f\n    events: [data, mkdir]",
            "targets[1].events[1]",
            "expected one of create, delete",
        ),
        # rules across keys
        ("  - name: local\n", "  - name: dr\n", "targets[1].name", "duplicate name 'dr'"),
        ("sources:\n", "spark: {remote: 'http://h:15002'}\nsources:\n", "spark.remote", "expected a Spark Connect URL"),
    ],
)
def test_bad_config_names_key_path_and_expectation(tmp_path, old, new, key, reason):
    assert old in GOOD
    err = load_error(tmp_path, GOOD.replace(old, new, 1))
    assert (err.key, reason in err.reason) == (key, True), err


def test_top_level_must_be_a_mapping(tmp_path):
    err = load_error(tmp_path, "- sources\n")
    assert (err.key, err.reason) == ("(top level)", "expected a mapping, got a list")


def test_a_key_set_to_nothing_takes_its_default(tmp_path):
    text = GOOD.replace("prefix: lustre1/", "prefix:\n    max_attempts: null").replace(
        "warehouse: file:///tmp/wh", "warehouse:"
    )
    cfg = load_config(write(tmp_path, text))
    assert (cfg.target("dr").prefix, cfg.target("dr").max_attempts) == ("", 6)
    assert cfg.warehouse == f"file://{tmp_path / 'warehouse'}"


def test_defaults_and_normalization(tmp_path):
    text = GOOD.replace("warehouse: file:///tmp/wh", "warehouse: wh/").replace("prefix: lustre1/", "prefix: lustre1")
    text = text.replace("format: jsonl}", "format: lustre}")
    cfg = load_config(write(tmp_path, text))
    assert cfg.warehouse == f"file://{tmp_path / 'wh'}"
    assert cfg.source("lustre1").changelogs.epochs_from == "mark"  # by format
    dr = cfg.target("dr")
    assert (dr.prefix, dr.path, dr.part_size, dr.events, dr.retention.idle_limit_s) == (
        "lustre1/",
        None,
        8 * 1024 * 1024,
        ("create", "delete", "rename", "data", "attrs", "xattrs"),
        86400.0,
    )
    feed = GOOD.replace(
        "kind: posix\n    path: replica-tree",
        "kind: feed\n    conn_id: c\n    bucket: b\n    events: [data, create, data]\n    retention: {idle_limit: 2h}",
    )
    f = load_config(write(tmp_path, feed)).target("local")
    assert (f.kind, f.path, f.prefix, f.events, f.retention.idle_limit_s) == (
        "feed",
        None,
        "",
        ("create", "data"),
        7200.0,
    )


def test_objects_built_in_code_are_checked_and_replaceable():
    t = TargetConfig(name="t", source="s", kind="posix", path="/replica")
    assert dataclasses.replace(t, control_dir=".ctl").control_dir == ".ctl"
    with pytest.raises(ConfigError, match=r"^TargetConfig: control_dir: .*contains '/'"):
        dataclasses.replace(t, control_dir="a/b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.name = "u"
    cfg = Config("x.yaml", "/tmp/wh", (), (t,))
    assert cfg.target("t") is t and hash(cfg) == hash(Config("x.yaml", "/tmp/wh", (), (t,)))
    assert EpochConfig(interval_s=300, start="2026-01-01T00:00:00Z").interval_s == 300.0


SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "config.schema.json"


def test_published_schema_is_the_models(capsys):
    assert main(["--schema"]) == 0
    assert SCHEMA.read_text() == capsys.readouterr().out, (
        "docs/config.schema.json is stale: python -m epochsync.core.config --schema > docs/config.schema.json"
    )


def test_published_schema_checks_a_file(tmp_path):
    schema = json.loads(SCHEMA.read_text())
    good = json.loads(json.dumps(yaml.safe_load(GOOD), default=lambda d: d.isoformat()))
    jsonschema.validate(good, schema)
    good["targets"][0]["colour"] = "blue"
    with pytest.raises(jsonschema.ValidationError, match="colour"):
        jsonschema.validate(good, schema)


def test_check_a_file_from_the_command_line(tmp_path, capsys):
    assert main([str(write(tmp_path, GOOD))]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'epochsync.yaml'}: 1 source(s), 2 target(s)\n"
    bad = write(tmp_path, GOOD.replace("sample: 1.0", "sample: 2"))
    assert main([str(bad)]) == 1
    assert (
        capsys.readouterr().err == f"error: {bad}: targets[0].verify.sample: expected a ratio from 0.0 to 1.0, got 2\n"
    )
