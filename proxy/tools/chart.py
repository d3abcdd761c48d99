"""A replay's chart: tokens sent and forwarded per turn, the compactions marked, the window and
the levels as lines. SVG and HTML are written here with no other package; PNG needs matplotlib
(the `chart` extra)."""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from proxy.errors import ProxyError
from proxy.tools.replay import COMPACTIONS, Totals, TurnResult, summary

WIDTH, HEIGHT = 960, 420
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 48, 40  # margins around the plot
FORMATS = (".svg", ".html", ".png")


class ChartError(ProxyError):
    """A chart that cannot be drawn: an unknown format, or PNG without matplotlib."""


@dataclasses.dataclass(frozen=True)
class Series:
    name: str
    label: str
    color: str
    dash: str | None  # SVG stroke-dasharray; None: solid
    value: Callable[[TurnResult], int]
    steps: bool  # a level: drawn as steps (flat between changes)


SERIES = (
    Series("sent", "tokens sent", "#8c8c8c", None, lambda t: t.sent, False),
    Series("forwarded", "tokens forwarded", "#1f6fb4", None, lambda t: t.forwarded, False),
    Series("window", "window", "#222222", None, lambda t: t.budget.window, True),
    Series("compact", "compact level", "#d62728", "6 4", lambda t: t.budget.compact_tokens, True),
    Series("prepare", "prepare level", "#e08214", "2 3", lambda t: t.budget.prepare_tokens, True),
    Series("target", "target", "#2ca02c", "6 4", lambda t: t.budget.target_tokens, True),
)


def check(path: str | Path) -> None:
    """ChartError unless a chart can be written to `path`: its format known, and for a PNG
    matplotlib installed."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ChartError(f"{path}: a chart is .svg, .html or .png")
    if suffix == ".png":
        _pyplot()


def write(path: str | Path, turns: Sequence[TurnResult], title: str) -> None:
    """The chart of `turns` in the format the file's suffix names (.svg, .html, .png)."""
    check(path)
    file = Path(path)
    suffix = file.suffix.lower()
    if not turns:
        raise ChartError("nothing to chart: the replay had no turns")
    if suffix == ".png":
        _png(file, turns, title)
    elif suffix == ".svg":
        file.write_text(svg(turns, title), encoding="utf-8")
    else:
        file.write_text(_html(turns, title), encoding="utf-8")


def svg(turns: Sequence[TurnResult], title: str) -> str:
    """A standalone SVG: one polyline a series, a circle a compaction."""
    top = _nice_top(max(max(s.value(t) for s in SERIES) for t in turns))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    last = max(len(turns) - 1, 1)

    def x(i: float) -> float:
        return LEFT + plot_w * i / last

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f"<title>{html.escape(title)}</title>",
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
        f'<text x="{LEFT}" y="18" font-size="14">{html.escape(title)}</text>',
    ]
    for tick in _ticks(top):
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
            f'stroke="#e6e6e6"/><text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" '
            f'text-anchor="end">{tick:,}</text>'
        )
    for tick in _ticks(len(turns)):
        if 1 <= tick <= len(turns):
            out.append(
                f'<text x="{x(tick - 1):.1f}" y="{HEIGHT - BOTTOM + 16}" '
                f'text-anchor="middle">{tick}</text>'
            )
    out.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 6}" text-anchor="middle">turn</text>'
        f'<text x="14" y="{TOP + plot_h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {TOP + plot_h / 2})">prompt tokens</text>'
    )
    for i, turn in enumerate(turns):
        if i and turn.turn == 1:  # a new session starts
            out.append(
                f'<line class="session" x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{TOP}" '
                f'y2="{TOP + plot_h}" stroke="#f0f0f0"/>'
            )
    for series in SERIES:
        points = _points(series, turns)
        coordinates = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in points)
        dash = f' stroke-dasharray="{series.dash}"' if series.dash else ""
        out.append(
            f'<polyline class="{series.name}" fill="none" stroke="{series.color}" '
            f'stroke-width="1.5"{dash} points="{coordinates}"/>'
        )
    for i, turn in enumerate(turns):
        if turn.action in COMPACTIONS:
            out.append(
                f'<circle class="compaction" cx="{x(i):.1f}" cy="{y(turn.forwarded):.1f}" r="3.5" '
                f'fill="#d62728"><title>turn {turn.turn}: {turn.action}</title></circle>'
            )
    out += _legend()
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _points(series: Series, turns: Sequence[TurnResult]) -> list[tuple[float, int]]:
    """A series' points; a level keeps only its changes (flat lines stay small)."""
    values = [series.value(t) for t in turns]
    if not series.steps:
        return list(enumerate(values))
    points: list[tuple[float, int]] = [(0, values[0])]
    for i in range(1, len(values)):
        if values[i] != values[i - 1]:
            points += [(i - 0.5, values[i - 1]), (i - 0.5, values[i])]
    points.append((max(len(values) - 1, 1), values[-1]))
    return points


def _legend() -> list[str]:
    out, left = [], LEFT
    for series in SERIES:
        dash = f' stroke-dasharray="{series.dash}"' if series.dash else ""
        out.append(
            f'<line x1="{left}" x2="{left + 22}" y1="36" y2="36" stroke="{series.color}" '
            f'stroke-width="2"{dash}/><text x="{left + 26}" y="40">{series.label}</text>'
        )
        left += 34 + 7 * len(series.label)
    out.append(
        f'<circle cx="{left + 6}" cy="36" r="3.5" fill="#d62728"/>'
        f'<text x="{left + 14}" y="40">compaction</text>'
    )
    return out


def _nice_top(value: int) -> int:
    """A round number at or above `value`: the axis' top."""
    if value <= 0:
        return 1
    power = int(10 ** max(0, math.floor(math.log10(value)) - 1))
    for step in (10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100):
        if step * power >= value:
            return step * power
    return 100 * power


def _ticks(top: int, count: int = 5) -> list[int]:
    """Round ticks from 0 to `top`, about `count` of them."""
    raw = max(1.0, top / count)
    power = int(10 ** math.floor(math.log10(raw)))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= 0.75 * raw)
    return list(range(0, top + 1, step))


def _html(turns: Sequence[TurnResult], title: str) -> str:
    lines = "\n".join(html.escape(line) for line in summary(Totals.of(turns)))
    return (
        '<!doctype html>\n<html lang="en">\n<head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title></head>\n"
        f'<body style="font-family: sans-serif">\n{svg(turns, title)}<pre>{lines}</pre>\n'
        "</body>\n</html>\n"
    )


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        from matplotlib import pyplot
    except ImportError:
        raise ChartError(
            "a PNG chart needs matplotlib: pip install 'compaction-proxy[chart]' "
            "(or write the chart as .svg or .html, which need nothing more)"
        ) from None
    return pyplot


def _png(file: Path, turns: Sequence[TurnResult], title: str) -> None:
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=(WIDTH / 100, HEIGHT / 100), dpi=100)
    try:
        numbers = range(1, len(turns) + 1)
        for series in SERIES:
            dashes = tuple(float(d) for d in series.dash.split()) if series.dash else ()
            line = axes.step if series.steps else axes.plot
            (drawn,) = line(
                numbers,
                [series.value(t) for t in turns],
                color=series.color,
                linewidth=1.5,
                label=series.label,
                **({"where": "mid"} if series.steps else {}),
            )
            if dashes:
                drawn.set_dashes(dashes)
        compactions = [(i, t.forwarded) for i, t in enumerate(turns, 1) if t.action in COMPACTIONS]
        if compactions:
            xs, ys = zip(*compactions, strict=True)
            axes.scatter(xs, ys, color="#d62728", s=14, zorder=3, label="compaction")
        axes.set(title=title, xlabel="turn", ylabel="prompt tokens", ylim=(0, None))
        axes.grid(axis="y", color="#e6e6e6")
        axes.legend(fontsize=8, ncols=4, loc="upper left")
        figure.tight_layout()
        figure.savefig(file, format="png")
    finally:
        pyplot.close(figure)
