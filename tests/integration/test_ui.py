"""The Airflow UI of `make airflow` in headless Chromium: log in, find the epoch DAG, trigger it, see it succeed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.airflow_stack import ROOT, replica, scheduler_stack_fixture, truth
from support.cdp import start_chromium

# each epoch run is a few spark-submits: minutes on two shared cores, more than the default timeout
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(3600),
    pytest.mark.usefixtures("spark_connect"),
]

DAG = "epochsync__sim__local"
OUTPUT = ROOT / "tests" / "output" / "test_ui"

scheduler_stack = pytest.fixture(scope="session")(scheduler_stack_fixture)


@pytest.fixture()
def browser():
    b = start_chromium("the UI test")
    yield b
    b.close()


def test_login_find_trigger_and_see_the_run_succeed(scheduler_stack, browser):
    stack, b = scheduler_stack, browser
    stack.unpause(DAG)
    shots: list[Path] = []

    # log in through the simple auth manager's form
    b.goto(stack.url + "/")
    b.wait_for("!!document.querySelector('input[name=password]')", what="the login form")
    b.type_into("input[name=username]", "admin")
    b.type_into("input[name=password]", stack.password)
    assert b.click_text("Sign in", exact=False)
    b.wait_for("!location.pathname.startsWith('/auth')", what="the login to finish")

    # find the DAG in the list and open it
    b.goto(stack.url + "/dags")
    b.wait_for(f"document.body.innerText.includes('{DAG}')", what="the DAG in the list")
    b.js(f"[...document.querySelectorAll('a')].find(a => a.innerText.trim() === '{DAG}').click()")
    b.wait_for(
        f"location.pathname.endsWith('/dags/{DAG}') && document.body.innerText.includes('Latest Dag Version')",
        what="the DAG page",
    )
    # the DAG's markdown doc, behind the "Dag Docs" button (drawn after the page's first
    # text, once the DAG's details have loaded: clicking at once failed on a busy machine)
    docs_button = (
        "[...document.querySelectorAll('button')].find(e => e.offsetParent !== null && "
        "((e.textContent || '').trim() === 'Dag Docs' || e.getAttribute('aria-label') === 'Dag Docs'))"
    )
    try:
        b.wait_for(f"!!{docs_button}", what="the Dag Docs button")
    except TimeoutError as exc:  # say what the header did show
        buttons = b.js(
            "[...document.querySelectorAll('button')].map(e => (e.textContent || e.getAttribute('aria-label') || '').trim()).filter(t => t).join(' | ')"
        )
        raise AssertionError(f"{exc}; the page's buttons: {buttons}") from None
    assert b.js(f"(() => {{const e = {docs_button}; e.scrollIntoView(); e.click(); return true;}})()")
    b.wait_for("document.body.innerText.includes('replicate one source into one target')", what="the DAG doc")
    shots.append(b.screenshot(OUTPUT / "00_dag_doc.png"))
    b.goto(f"{stack.url}/dags/{DAG}")  # back to a page without the doc dialog
    b.wait_for("document.body.innerText.includes('Latest Dag Version')", what="the DAG page again")
    b.wait_for("[...document.querySelectorAll('button')].some(e => e.innerText.trim() === 'Trigger')", what="Trigger")

    # trigger epoch 1 with the params form
    assert b.click_text("Trigger")
    b.wait_for("!!document.querySelector('[role=dialog] input[name=element_epoch]')", what="the trigger form")
    assert b.js("(() => {const e = document.querySelector('input[name=element_epoch]'); e.focus(); return true;})()")
    b.send("Input.insertText", {"text": "1"})
    assert b.js("document.querySelector('input[name=element_epoch]').value") == "1"
    shots.append(b.screenshot(OUTPUT / "01_trigger_form.png"))
    assert b.click_text("Trigger", selector="[role=dialog] button")

    # the run appears and succeeds, as the UI shows it
    deadline = time.monotonic() + 1200
    run = None
    while time.monotonic() < deadline:
        runs = [r for r in stack.runs(DAG) if r["run_type"] == "manual"]
        if runs and runs[-1]["state"] in ("success", "failed"):
            run = runs[-1]
            break
        time.sleep(10)
    assert run is not None, f"the triggered run did not finish:\n{stack.airflow.tail()}"
    assert run["conf"]["epoch"] == 1
    assert run["state"] == "success", stack.task_states(DAG, run["dag_run_id"])
    b.goto(f"{stack.url}/dags/{DAG}/runs")
    b.wait_for(f"document.body.innerText.includes('{run['dag_run_id']}')", what="the run in the list")
    b.wait_for("document.body.innerText.toLowerCase().includes('success')", what="the success state")
    shots.append(b.screenshot(OUTPUT / "02_run_succeeded.png"))
    states = stack.task_states(DAG, run["dag_run_id"])
    assert states["commit"] == "success" and states["rollback"] == "skipped"
    committed, rows = replica(stack.config, "local", stack.env)
    assert committed == 1 and rows == truth(stack.sim, 1)
    assert all(s.stat().st_size > 10_000 for s in shots)  # real screenshots, not blank files


def test_the_report_clips_no_text_and_counts_the_delay_from_closure(browser, tmp_path):
    """``epochsync report`` in a browser: every chart label inside its chart, nothing wider than the window."""
    import json
    import time

    from epochsync.core.config import load_config
    from epochsync.journal.undo import write_json_atomic
    from epochsync.report.status import build_report
    from epochsync.warehouse.events import FAILED, record_event
    from epochsync.warehouse.paths import Warehouse, local_path

    cfg_file = tmp_path / "epochsync.yaml"
    cfg_file.write_text(
        f"warehouse: file://{tmp_path}/wh\n"
        "sources:\n  - name: sim\n    root_fid: '[0x200000007:0x1:0x0]'\n    servers: [MDT0000]\n"
        f"    changelogs: {{uri: {tmp_path}/cl, format: jsonl}}\n    store: {{conn_id: s, bucket: b}}\n"
        "    epoch: {interval: 5m, start: 2026-01-01T00:00:00Z}\n"
        f"targets:\n  - name: a-target-with-a-long-name-for-the-table\n    source: sim\n    kind: posix\n"
        f"    path: {tmp_path}/replica\n"
    )
    cfg = load_config(cfg_file)
    tname = cfg.targets[0].name
    now = time.time()
    for e in range(1, 31):  # a month-old window: a delay counted from the window's end would be huge
        write_json_atomic(
            local_path(Warehouse(cfg.warehouse).stats(tname, e)),
            {
                "target": tname,
                "epoch": e,
                "records_in": 1000 * e,
                "net_operations": {"created": e},
                "bytes_changed": 2**20 * e,
                "bytes_pulled": 2**20 * e,
                "bytes_written": 2**20 * e,
                "bytes_copied": 0,
                "durations": {
                    "ingest": 1.2,
                    "merge": 3.4,
                    "translate": 1.1,
                    "apply": 2.0,
                    "verify": 1.5,
                    "commit": 0.1,
                },
                "closed_seen_at": now - 20,
                "committed_at": now - 20 + 9.5 + e % 3,
            },
        )
    write_json_atomic(f"{tmp_path}/replica/.epochsync/manifest.json", {"target": tname, "epoch": 30})
    record_event(cfg.warehouse, tname, FAILED, 31, message="apply: " + "a long message " * 20)
    page = tmp_path / "report.html"
    page.write_text(build_report(cfg, list(cfg.targets)))

    browser.goto(page.as_uri())
    browser.wait_for("document.querySelectorAll('svg').length == 4", what="the report's charts")
    clipped = json.loads(
        browser.js("""JSON.stringify((() => {
        const bad = [];
        for (const svg of document.querySelectorAll('svg')) {
            const box = svg.getBoundingClientRect();
            for (const t of svg.querySelectorAll('text')) {
                const r = t.getBoundingClientRect();
                if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1)
                    bad.push(t.textContent);
            }
        }
        if (document.documentElement.scrollWidth > window.innerWidth + 1) bad.push('the page is wider than the window');
        for (const s of document.querySelectorAll('.scroll'))
            if (s.scrollWidth > s.clientWidth + 1) bad.push('a table needs scrolling');
        return bad;
    })())""")
    )
    browser.screenshot(OUTPUT / "report.png")
    assert clipped == [], clipped
    delays = browser.js(
        "Array.from(document.querySelectorAll('table')[1].rows).slice(1).map(r => r.cells[9].textContent)"
    )
    assert len(delays) == 30 and all(d.endswith(" s") and float(d[:-2]) < 60 for d in delays), delays
