"""Bar charts as geometry for the report's template: inline SVG, no plotting library, no JavaScript.

:func:`bar_chart` turns per-epoch series into rectangles, axis ticks with units and a
legend, all inside one ``viewBox`` (the page scales it; nothing is drawn outside it, so
no label is clipped). Values that are unknown (``None``) draw no bar and are listed in
the chart's note, never drawn as zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
WIDTH, HEIGHT = 760, 320
LEFT, RIGHT, TOP, BOTTOM = 78, 16, 34, 84
LEGEND_ITEM = 180


@dataclass(frozen=True)
class Bar:
    """One bar of a chart, in viewBox coordinates, with its tooltip."""

    x: float
    y: float
    w: float
    h: float
    color: str
    title: str


@dataclass(frozen=True)
class Label:
    """One axis label of a chart, in viewBox coordinates."""

    x: float
    y: float
    text: str


@dataclass
class Chart:
    """Everything the template draws for one chart, in viewBox coordinates."""

    title: str
    y_title: str
    x_title: str
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    top: int = TOP
    plot_right: int = WIDTH - RIGHT
    plot_bottom: int = HEIGHT - BOTTOM
    bars: list[Bar] = field(default_factory=list)
    y_ticks: list[Label] = field(default_factory=list)
    x_labels: list[Label] = field(default_factory=list)
    legend: list[tuple[float, float, str, str]] = field(default_factory=list)  # x, y, color, name
    note: str = ""


def fmt_bytes(n) -> str:
    """``n`` bytes in binary units (``-`` for unknown)."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_value(v: float | None, unit: str) -> str:
    """A value with its unit: bytes in binary units, seconds and counts as numbers."""
    if v is None:
        return "unknown"
    if unit == "bytes":
        return fmt_bytes(v)
    text = f"{v:,.1f}".rstrip("0").rstrip(".") if v != int(v) else f"{int(v):,}"
    return f"{text} {unit}".strip()


def nice_ticks(vmax: float, most: int = 5) -> list[float]:
    """0 and round steps (1, 2, 5 x 10^k) up to at least ``vmax``, at most ``most`` + 1 ticks."""
    if vmax <= 0:
        return [0.0, 1.0]
    raw = vmax / most
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = math.ceil(vmax / step - 1e-9)
    return [i * step for i in range(n + 1)]


def bar_chart(
    title: str,
    unit: str,
    epochs: list,
    series: Mapping[str, Sequence[float | None]],
    *,
    stacked: bool = False,
    y_title: str | None = None,
    x_title: str = "epoch",
    colors: dict[str, str] | None = None,
) -> Chart:
    """Grouped (or stacked) bars per x value (an epoch, by default); returns the chart's geometry.

    ``series`` maps a name to one value per x value (``None``: unknown). The y axis is
    labelled ``y_title`` with tick values in ``unit`` ("s", "bytes", "epochs", ...).
    ``colors`` fixes a series' colour by name (the same stage in the same colour on every
    target's chart); other series take :data:`COLORS` by position.
    """
    chart = Chart(title=title, y_title=y_title or unit, x_title=x_title)
    names = list(series)
    palette = [(colors or {}).get(name, COLORS[j % len(COLORS)]) for j, name in enumerate(names)]
    n = max(1, len(epochs))
    if stacked:
        totals = [sum(v for v in (series[s][i] for s in names) if v is not None) for i in range(len(epochs))]
    else:
        totals = [max([v for v in (series[s][i] for s in names) if v is not None] or [0]) for i in range(len(epochs))]
    ticks = nice_ticks(max(totals + [0]))
    top = ticks[-1]
    plot_h = chart.plot_bottom - chart.top
    group = (chart.plot_right - chart.left) / n
    width = group * 0.8 if stacked else group * 0.8 / max(1, len(names))
    scale = plot_h / top if top else 0
    unknown: list[int] = []
    for i, e in enumerate(epochs):
        x0 = chart.left + i * group + group * 0.1
        base = 0.0
        for j, name in enumerate(names):
            v = series[name][i]
            if v is None:
                if e not in unknown:
                    unknown.append(e)
                continue
            h = v * scale
            x = x0 if stacked else x0 + j * width
            y = chart.plot_bottom - (base + v) * scale if stacked else chart.plot_bottom - h
            chart.bars.append(
                Bar(
                    round(x, 1),
                    round(y, 1),
                    round(max(width - 1, 1), 1),
                    round(h, 1),
                    palette[j],
                    f"{x_title} {e} {name}: {fmt_value(v, unit)}",
                )
            )
            if stacked:
                base += v
    every = max(1, math.ceil(n / 20))  # at most about 20 epoch labels
    chart.x_labels = [
        Label(round(chart.left + (i + 0.5) * group, 1), chart.plot_bottom + 14, str(e))
        for i, e in enumerate(epochs)
        if i % every == 0
    ]
    chart.y_ticks = [Label(chart.left - 6, round(chart.plot_bottom - t * scale, 1), fmt_value(t, unit)) for t in ticks]
    per_row = max(1, (chart.width - chart.left) // LEGEND_ITEM)
    for j, name in enumerate(names):
        row, col = divmod(j, per_row)
        chart.legend.append((chart.left + col * LEGEND_ITEM, chart.plot_bottom + 44 + row * 16, palette[j], name))
    if unknown:
        chart.note = f"unknown for {x_title}" + ("s " if len(unknown) > 1 else " ") + ", ".join(map(str, unknown))
    return chart


def _env():
    import os

    from jinja2 import Environment, FileSystemLoader, select_autoescape

    return Environment(
        loader=FileSystemLoader(os.path.dirname(os.path.abspath(__file__))),
        autoescape=select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def template(name: str):
    """A template of this folder (``report.html.j2``, ``chart.svg.j2``), HTML-autoescaped."""
    return _env().get_template(name)


def render_svg(chart: Chart) -> str:
    """One chart as an inline ``<svg>`` element (the same markup the report page uses)."""
    return template("chart.svg.j2").render(c=chart)
