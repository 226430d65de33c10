"""The built site in headless Chromium: the home page, the configuration reference and the
benchmark results render, and no table is clipped or wider than its column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cdp import start_chromium

OUTPUT = Path(__file__).resolve().parents[1] / "output" / "docs"
#: page -> the title its first heading must have
PAGES = {
    "index.html": "epochsync",
    "reference/configuration.html": "Configuration reference",
    "benchmarks/results.html": "Results",
}
#: a desktop window and a small laptop's
WIDTHS = (1400, 1024)

# every table and chart of the page: a problem per element that is clipped or overflows
_PROBLEMS = """JSON.stringify((() => {
    const bad = [];
    const doc = document.documentElement;
    if (doc.scrollWidth > window.innerWidth + 1) bad.push(`the page is ${doc.scrollWidth}px wide in a ${window.innerWidth}px window`);
    const article = document.querySelector('.md-content article') || document.body;
    const box = article.getBoundingClientRect();
    document.querySelectorAll('.md-typeset table').forEach((t, i) => {
        const r = t.getBoundingClientRect();
        const head = (t.rows[0] ? t.rows[0].innerText : '').slice(0, 60);
        if (r.right > box.right + 1 || r.left < box.left - 1) bad.push(`table ${i} (${head}) leaves the text column`);
        let el = t.parentElement;
        while (el && el !== article) {
            if (el.scrollWidth > el.clientWidth + 1) { bad.push(`table ${i} (${head}) needs scrolling`); break; }
            el = el.parentElement;
        }
        for (const cell of t.querySelectorAll('td, th'))
            if (cell.scrollWidth > cell.clientWidth + 1) { bad.push(`table ${i} (${head}): a clipped cell: ${cell.innerText.slice(0, 60)}`); break; }
    });
    document.querySelectorAll('svg.es-chart').forEach((svg, i) => {
        const b = svg.getBoundingClientRect();
        if (b.right > box.right + 1) bad.push(`chart ${i} leaves the text column`);
        for (const t of svg.querySelectorAll('text')) {
            const r = t.getBoundingClientRect();
            if (r.left < b.left - 1 || r.right > b.right + 1 || r.top < b.top - 1 || r.bottom > b.bottom + 1)
                bad.push(`chart ${i}: label outside the chart: ${t.textContent}`);
        }
    });
    return bad;
})())"""


@pytest.fixture(scope="module")
def browser():
    b = start_chromium("the documentation site's test")
    yield b
    b.close()


def test_the_site_renders_without_clipped_or_overflowing_tables(built_site, browser):
    b = browser
    problems = []
    for width in WIDTHS:
        b.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        )
        for page, title in PAGES.items():
            b.goto((built_site / page).as_uri())
            b.wait_for("!!document.querySelector('.md-content h1')", what=f"the first heading of {page}")
            h1 = b.js("document.querySelector('.md-content h1').innerText.trim()")
            assert h1.startswith(title), (page, h1)
            counts = b.js(
                "[document.querySelectorAll('.md-typeset table').length, document.querySelectorAll('svg.es-chart').length]"
            )
            if page != "index.html":
                assert counts[0] > 0, f"{page}: no table rendered"
            if page.startswith("benchmarks/"):
                assert counts[1] > 0, f"{page}: no chart rendered"
            problems += [f"{page} at {width}px: {p}" for p in json.loads(b.js(_PROBLEMS))]
            b.screenshot(OUTPUT / f"{page.replace('/', '_').removesuffix('.html')}-{width}.png")
    assert problems == [], "\n".join(problems)
