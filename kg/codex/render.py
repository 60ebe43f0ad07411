"""Render a codex page model as ONE self-contained HTML file: no network, no server.

The page is a Jinja2 template (`codex.html.j2`, next to this file) with its stylesheet
(`codex.css`), its script (`codex.js`) and the graph library inlined: Cytoscape.js
(kg/codex/assets/cytoscape.min.js, MIT, vendored through a pinned npm lock file; `make
vendor-codex`). Why that library: docs/decisions/codex-graph-library.md.

The chapter-quality chart is SVG drawn here (a few rectangles per metric): small
multiples need no charting library, and they then show without JavaScript too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from kg.codex.models import CodexPage, QualityChapter

HERE = Path(__file__).resolve().parent
LIBRARY = HERE / "assets" / "cytoscape.min.js"
LIBRARY_NAME = "Cytoscape.js 3.34.4 (MIT)"
#: Metrics charted per chapter: (quality-table key, title, fixed maximum or None to scale).
CHART_METRICS: tuple[tuple[str, str, float | None], ...] = (
    ("editor_mean", "editor mean score", 1.0),
    ("distinct_trigrams", "distinct word trigrams", 1.0),
    ("words", "words", None),
    ("mean_sentence_words", "mean sentence length (words)", None),
)
CHART_HEIGHT = 64


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


@cache
def _inline(path: Path) -> str:
    """A file's text, for a <script> or <style> element (refused if it could end the element)."""
    text = path.read_text(encoding="utf-8")
    closing = "</script" if path.suffix == ".js" else "</style"
    if closing in text.lower():
        raise ValueError(f"{path.name} contains {closing!r} and cannot be inlined")
    return text


def script_json(data: Any) -> Markup:
    """JSON for a <script type="application/json"> element: `<`, `>` and `&` escaped so no
    text in the data (a quote from a chapter) can close the element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


@dataclass(frozen=True)
class ChartBar:
    """One rectangle of a chart (SVG units); a dropped part is drawn as flagged, in red."""

    x: int
    y: float
    w: int
    h: float
    flagged: bool
    dropped: bool
    tip: str


@dataclass(frozen=True)
class ChartTick:
    x: float
    text: str


@dataclass(frozen=True)
class Chart:
    """One small chart of a metric over the chapters, with its range as text."""

    title: str
    width: int
    height: int
    bars: list[ChartBar]
    ticks: list[ChartTick]
    low: str
    high: str


def quality_charts(page: CodexPage) -> list[Chart]:
    """Per metric, the bars of a small SVG chart: one bar per chapter, flagged chapters marked;
    then the facts grounding kept and dropped, stacked."""
    chapters = page.quality
    if not chapters:
        return []
    step = max(6, min(28, 720 // max(1, len(chapters))))
    # Chapter numbers under the bars, as many as fit.
    every = max(1, -(-22 // step))
    ticks = [
        ChartTick(x=4 + i * step + (step - 2) / 2, text=str(c.chapter))
        for i, c in enumerate(chapters)
        if i % every == 0
    ]
    charts = [
        chart
        for key, title, fixed in CHART_METRICS
        if (chart := _metric_chart(chapters, key, title, fixed, step, ticks)) is not None
    ]
    if (facts := _facts_chart(chapters, step, ticks)) is not None:
        charts.append(facts)
    return charts


def _metric_chart(
    chapters: list[QualityChapter],
    key: str,
    title: str,
    fixed: float | None,
    step: int,
    ticks: list[ChartTick],
) -> Chart | None:
    """One metric's bars, scaled to its fixed maximum (or its largest value); None where no
    chapter has it."""
    values = [_number(c.values.get(key)) for c in chapters]
    present = [v for v in values if v is not None]
    if not present:
        return None
    top = fixed if fixed is not None else max(max(present), 1.0)
    bars = []
    for i, (chapter, value) in enumerate(zip(chapters, values, strict=True)):
        if value is None:
            continue
        height = max(1.0, round(CHART_HEIGHT * min(value, top) / top, 1))
        flag = " (flagged)" if chapter.flagged else ""
        bars.append(
            ChartBar(
                x=4 + i * step,
                y=round(CHART_HEIGHT - height, 1),
                w=max(2, step - 2),
                h=height,
                flagged=chapter.flagged,
                dropped=False,
                tip=f"chapter {chapter.chapter}: {title} {_fmt(value)}{flag}",
            )
        )
    return Chart(
        title=title,
        width=step * len(chapters) + 8,
        height=CHART_HEIGHT,
        bars=bars,
        ticks=ticks,
        low=_fmt(min(present)),
        high=_fmt(max(present)),
    )


def _facts_chart(chapters: list[QualityChapter], step: int, ticks: list[ChartTick]) -> Chart | None:
    """The facts grounding kept (dark) with those it dropped (red) stacked on them; None where
    no chapter counted them."""
    kept = [
        (_number(c.values.get("facts_kept")), _number(c.values.get("facts_dropped")))
        for c in chapters
    ]
    if not any(k is not None for k, _ in kept):
        return None
    top = max(max((k or 0) + (d or 0) for k, d in kept), 1.0)
    bars = []
    for i, (chapter, (k, d)) in enumerate(zip(chapters, kept, strict=True)):
        k, d = k or 0.0, d or 0.0
        h_kept = round(CHART_HEIGHT * k / top, 1)
        h_dropped = round(CHART_HEIGHT * d / top, 1)
        tip = f"chapter {chapter.chapter}: {int(k)} facts kept, {int(d)} dropped by grounding"
        x, w = 4 + i * step, max(2, step - 2)
        bars.append(ChartBar(x, round(CHART_HEIGHT - h_kept, 1), w, h_kept, False, False, tip))
        if h_dropped:
            y = round(CHART_HEIGHT - h_kept - h_dropped, 1)
            bars.append(ChartBar(x, y, w, h_dropped, True, True, tip))
    return Chart(
        title="facts kept (dark) and dropped (red)",
        width=step * len(chapters) + 8,
        height=CHART_HEIGHT,
        bars=bars,
        ticks=ticks,
        low="0",
        high=_fmt(top),
    )


def _fmt(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.2f}"


def render_codex(page: CodexPage) -> str:
    """The page as HTML text (deterministic: the same page model gives the same bytes)."""
    data = {"graph": page.graph.model_dump(mode="json"), "kind": page.kind, "as_of": page.as_of}
    return (
        _environment()
        .get_template("codex.html.j2")
        .render(
            page=page,
            data_json=script_json(data),
            charts=quality_charts(page),
            library_name=LIBRARY_NAME,
            library=Markup(_inline(LIBRARY)),
            app=Markup(_inline(HERE / "codex.js")),
            css=Markup(_inline(HERE / "codex.css")),
        )
    )
