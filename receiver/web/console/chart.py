"""An SVG chart of reconcile runs over time (pure: data in, markup out; no script).

Bars: transitions recovered per run (stacked by path: lists, sweep, events); a red mark:
drift left unresolved. Server-rendered, so the console needs no front-end build and no
JavaScript (its Content-Security-Policy allows none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape

PATH_COLOURS = {"lists": "#3b82f6", "sweep": "#8b5cf6", "events": "#14b8a6"}
DRIFT_COLOUR = "#dc2626"


@dataclass(frozen=True, kw_only=True, slots=True)
class RunPoint:
    """One run on the chart."""

    run_id: int
    at: datetime
    status: str
    recovered: dict[str, int]
    unresolved: int


def svg(points: Sequence[RunPoint], *, width: int = 900, height: int = 220) -> str:
    """The chart, oldest run on the left; an empty-state text when there is no run."""
    pad_left, pad_bottom, pad_top = 40, 36, 16
    inner_w, inner_h = width - pad_left - 10, height - pad_bottom - pad_top
    if not points:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="60" role="img" '
            'aria-label="no reconcile runs yet"><text x="10" y="35" fill="#6b7280">'
            "No reconcile run stored yet.</text></svg>"
        )
    peak = max(max(sum(p.recovered.values()), p.unresolved) for p in points) or 1
    step = inner_w / len(points)
    bar = max(2.0, min(28.0, step * 0.7))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="recovered transitions and drift over the last {len(points)} runs">',
        f'<line x1="{pad_left}" y1="{pad_top + inner_h}" x2="{width - 10}" '
        f'y2="{pad_top + inner_h}" stroke="#9ca3af"/>',
        f'<text x="{pad_left - 6}" y="{pad_top + 10}" text-anchor="end" font-size="11" '
        f'fill="#6b7280">{peak}</text>',
        f'<text x="{pad_left - 6}" y="{pad_top + inner_h}" text-anchor="end" font-size="11" '
        'fill="#6b7280">0</text>',
    ]
    for i, p in enumerate(points):
        x = pad_left + i * step + (step - bar) / 2
        y: float = pad_top + inner_h
        title = escape(
            f"run #{p.run_id} {p.at:%Y-%m-%d %H:%M} {p.status}: recovered "
            + ", ".join(f"{k} {v}" for k, v in p.recovered.items() if v)
            + f"; unresolved {p.unresolved}"
        )
        parts.append(f"<g><title>{title}</title>")
        for path in ("lists", "sweep", "events"):
            n = p.recovered.get(path, 0)
            if not n:
                continue
            h = n / peak * inner_h
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{PATH_COLOURS[path]}" data-path="{path}"/>'
            )
        if p.unresolved:
            dy = pad_top + inner_h - p.unresolved / peak * inner_h
            parts.append(
                f'<rect x="{x:.1f}" y="{dy - 2:.1f}" width="{bar:.1f}" height="4" '
                f'fill="{DRIFT_COLOUR}" data-drift="{p.unresolved}"/>'
            )
        if p.status not in ("ok", "dry_run"):
            parts.append(
                f'<circle cx="{x + bar / 2:.1f}" cy="{pad_top + inner_h + 8}" r="3" '
                f'fill="{DRIFT_COLOUR}"/>'
            )
        parts.append("</g>")
    first, last = points[0].at, points[-1].at
    parts.append(
        f'<text x="{pad_left}" y="{height - 6}" font-size="11" fill="#6b7280">'
        f"{first:%Y-%m-%d %H:%M}</text>"
        f'<text x="{width - 10}" y="{height - 6}" text-anchor="end" font-size="11" '
        f'fill="#6b7280">{last:%Y-%m-%d %H:%M}</text>'
    )
    legend_x = pad_left + 150
    for path, colour in (*PATH_COLOURS.items(), ("unresolved (drift)", DRIFT_COLOUR)):
        parts.append(
            f'<rect x="{legend_x}" y="{height - 16}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{legend_x + 14}" y="{height - 7}" font-size="11" fill="#374151">'
            f"{escape(path)}</text>"
        )
        legend_x += 70 + 6 * len(path)
    parts.append("</svg>")
    return "".join(parts)
