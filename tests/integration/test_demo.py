"""``make demo``'s own source on a real Spark standalone cluster: both targets through the Airflow
DAG, the injected failure and its rollback, ground truth.

The demo itself asserts every epoch of both targets against the simulator's ground truth;
this test runs it with the demo's defaults (seed 2026, 2,000 files, 6 epochs, the failure
injected into epoch 4: what ``make demo`` runs, so a change that breaks ``make demo`` fails
here) with ``--cluster`` (a standalone master and
one worker started from the venv's pyspark, the Spark Connect server on that master) and
checks what it reports: the task states of the failed run (apply failed, verify and commit
upstream_failed, rollback ran once and failed the run on purpose), that the master lists
the one Spark application every run used, that the merge's and apply's Spark tasks ran on
the worker's executor (the server's event log), and that it left no process behind.

It runs with ``--reintegrate`` (``make demo REINTEGRATE=1``), small (a cache of 2 epochs,
24 files), on the same servers: the cache's epochs reach the striped master through the
DAG ``epochsync__cache__master``; at epoch 2 a master-side write is refused by the write
fence and kept, an injected failure rolls the master back to epoch 1, and the retry
equals the cache's ground truth (the demo compares; the test reads what it reports and
checks the master's stripe objects).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
ORDER = ["wait_epoch_closed", "ingest", "merge", "translate", "apply", "verify", "commit"]


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args and "pytest" not in args:
            found.append(args)
    return found


def _run_demo(cmd: list[str]) -> subprocess.CompletedProcess:
    """Runs the demo; a test run stopped meanwhile (SIGTERM, Ctrl-C, the timeout) sends the demo
    SIGTERM and waits for it, so that it stops the servers it started (``subprocess.run`` would
    kill it at once and leave them running)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=3000)
    except BaseException:
        proc.terminate()
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_the_default_demo_replicates_both_targets_and_rolls_back_the_injected_failure(tmp_path):
    # make demo's own source (issue 50: make demo failed on main while this test ran a smaller
    # one): the demo's defaults - seed, files, epochs, the failed epoch and its mutation count -
    # read from its parser, so the two cannot drift apart; only the cluster, the reintegration
    # (kept small) and the scratch folder are this test's
    from epochsync_dev.demo import parse_args

    d = parse_args([])
    assert (d.seed, d.files, d.epochs, d.fail_epoch) == (2026, 2000, 6, 4)  # the README's demo
    work = tmp_path / "demo"
    cmd = [
        sys.executable,
        "-m",
        "epochsync_dev.demo",
        "--workdir",
        str(work),
        "--cluster",
        "--reintegrate",
        "--cache-epochs",
        "2",
        "--cache-files",
        "24",
    ]
    done = _run_demo(cmd)
    out = done.stdout
    assert done.returncode == 0, out[-6000:] + done.stderr[-3000:]
    assert re.search(r"^demo: PASSED in \d+s: every epoch of both targets equals", out, re.M), out[-3000:]
    assert "every cache epoch was reintegrated into the striped master" in out
    assert "not run" not in out

    summary = json.loads((work / "demo-summary.json").read_text())
    assert summary["verdict"] == "passed" and summary["failures"] == []
    assert summary["args"]["seed"] == d.seed and summary["args"]["files"] == d.files
    runs = {(r["epoch"], r["target"], r["kind"]): r for r in summary["runs"]}
    expected = {(e, t, "run") for e in range(1, d.epochs + 1) for t in ("local", "s3")}
    expected.discard((d.fail_epoch, "s3", "run"))
    expected |= {(d.fail_epoch, "s3", "injected-failure"), (d.fail_epoch, "s3", "retry")}
    assert set(runs) == expected
    for key, run in runs.items():
        if key[2] == "injected-failure":
            continue
        assert run["ok"] and run["state"] == "success", run
        assert {t: run["tasks"][t] for t in ORDER} == dict.fromkeys(ORDER, "success")
        assert run["tasks"]["rollback"] == "skipped"
        assert run["stats"]["records_in"] > 0
        line = rf"^epoch +{key[0]} {key[1]:<6} records +\d+ .* ok, equals ground truth"
        assert re.search(line, out, re.M), f"no line for {key} in:\n{out[-3000:]}"
    # the server-side copies of source versions are reached (the fast path that made make demo
    # fail on main: files truncated down and then up copied from their shorter version); the
    # demo compares every epoch with the ground truth, which is what catches a wrong copy
    assert sum(runs[(e, "s3", "run" if e != d.fail_epoch else "retry")]["stats"]["bytes_copied"] for e in (1, 2)) > 0

    f = d.fail_epoch
    failed = runs[(f, "s3", "injected-failure")]
    assert failed["ok"] and failed["state"] == "failed"
    assert failed["tasks"]["apply"] == "failed"
    assert failed["tasks"]["verify"] == failed["tasks"]["commit"] == "upstream_failed"
    assert failed["tasks"]["rollback"] == "failed" and failed["tries"]["rollback"] == 1
    assert f"rolled back: the target is at epoch {f - 1} again" in Path(failed["log"]).read_text()
    assert re.search(
        rf"^epoch +{f} s3 .*FAILED as injected in apply; rolled back to epoch {f - 1}, equals it", out, re.M
    )

    # the transcript the README and Getting started show is this run's, apart from its timings
    # (the seed fixes the rest): kept in bench/results/demo.txt by make demo-transcript
    from epochsync_dev.docs import RESULTS
    from epochsync_dev.docs.demo_transcript import MAKE_AGAIN, RESULT, kept_transcript, shape

    made = (work / "demo-transcript.txt").read_text()
    (ROOT / "build").mkdir(exist_ok=True)
    (ROOT / "build" / "demo-transcript.txt").write_text(made)  # to look at, or keep, after a failure
    kept = kept_transcript(RESULTS)
    assert kept is not None and shape(kept) == shape(made), (
        f"bench/results/{RESULT} is not this demo's transcript (this run's: build/demo-transcript.txt); "
        f"run {MAKE_AGAIN}\n--- kept\n{kept}\n--- this run\n{made}"
    )

    # the s3 chain reuses the records the posix chain ingested: no second ingest job
    s3_log = Path(runs[(2, "s3", "run")]["log"]).read_text()
    assert "already ingested" in s3_log and "nothing to do" in s3_log
    assert "nothing to do (param reingest" not in Path(runs[(2, "local", "run")]["log"]).read_text()

    # one Spark application on the standalone master served every stage of every run ...
    spark = summary["spark"]
    assert spark["master"].startswith("spark://127.0.0.1:")
    apps = spark["cluster"]["activeapps"] + spark["cluster"]["completedapps"]
    assert [a["name"] for a in apps] == ["epochsync"], apps
    assert [w["state"] for w in spark["cluster"]["workers"]] == ["ALIVE"]
    # ... every Spark task ran on the worker's executor, not in the driver ...
    stages = spark["stages"]
    assert stages["epochsync-warm-up"]["tasks"] > 0, stages
    for tag, stage in stages.items():
        if stage["tasks"]:
            assert stage["executors"] and "driver" not in stage["executors"], (tag, stage)
    # ... and the small stages ran no Spark job at all: the merges (below 250,000 rows) and the
    # ingests of a few thousand records run in the task's own process
    for tag in (
        "epochsync-merge-local-e1",
        "epochsync-merge-s3-e2",
        "epochsync-ingest-local-e2",
    ):
        assert not stages.get(tag, {}).get("tasks"), (tag, stages[tag])

    # cache reintegration through the DAG, on the same servers
    reint = summary["reintegration"]
    assert reint["dag_id"] == "epochsync__cache__master" and (reint["stripe_size"], reint["stripe_count"]) == (65536, 4)
    kinds = [(r["epoch"], r["kind"], r["ok"], r["state"]) for r in reint["runs"]]
    assert kinds == [
        (1, "run", True, "success"),
        (2, "write-fence", True, "failed"),
        (2, "injected-failure", True, "failed"),
        (2, "retry", True, "success"),
    ]
    fenced, failing, retry = reint["runs"][1:]
    assert fenced["tasks"]["apply"] == "failed" and fenced["tasks"]["commit"] == "upstream_failed"
    fence = reint["fence"]
    assert fence["message"].startswith(
        f"write fence: target master (s3://master/) was changed by someone else since epoch 1: {fence['key']}: "
    )
    assert (
        f"now: version {fence['version']}, 21 bytes" in fence["message"] and "Nothing was written" in fence["message"]
    )
    assert "master's version kept, master at epoch 1" in fenced["status"]
    assert failing["tasks"]["apply"] == "failed" and failing["tasks"]["rollback"] == "failed"
    assert "rolled back: the target is at epoch 1 again" in Path(failing["log"]).read_text()
    assert failing["status"] == "FAILED as injected in apply; rolled back to epoch 1, equals it"
    assert retry["status"] == "ok, equals the cache after retry" and retry["stats"]["records_in"] > 0
    assert reint["runs"][0]["status"] == "ok, equals the cache"
    # the master's layout, not the cache's: stripe objects of at most 64 KiB
    assert reint["stripes"]["objects"] > 0 and 0 < reint["stripes"]["largest"] <= 65536
    assert re.search(r"^epoch +2 master .* REFUSED by the write fence \(names the key and both versions\)", out, re.M)
    for tag in ("epochsync-merge-master-e1", "epochsync-apply-master-e2"):  # small: in the tasks' process
        assert not stages.get(tag, {}).get("tasks"), (tag, stages[tag])

    report = Path(summary["report"])
    assert report.is_file() and "<svg" in report.read_text()
    assert f"demo: report {report}" in out

    # SeaweedFS, Airflow and Spark processes are gone
    assert _processes_mentioning(str(work)) == []

    # the five-minute tour of the README and Getting started, on this demo's output
    from support.docs import run_tour

    tour = run_tour(work, epochs=d.epochs)
    assert re.search(rf"^local +posix +Active +{d.epochs} ", tour["status"].stdout, re.M), tour["status"].stdout
    assert re.search(r"^(DELETE|RENAME|NEW|LINK|MODIFY) ", tour["changes"].stdout, re.M), tour["changes"].stdout
    assert tour["report"].stdout.strip().endswith("index.html")
    assert tour["rollback"].stdout.strip() == "nothing to roll back"
