"""A small line-and-point chart as inline SVG: the same markup in the app and in the saved HTML report, which
must open without a network (no script, no fonts, no images). Every label is escaped here."""
from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

WIDTH, HEIGHT = 640, 320
MARGIN = dict(left=52, right=16, top=16, bottom=44)
PALETTE = ("#4f46e5", "#dc2626", "#059669", "#d97706", "#0891b2", "#7c3aed", "#db2777", "#65a30d")


@dataclass(frozen=True)
class Series:
    label: str
    points: list[tuple[float, float]]  # (x, y); drawn as a line when ``line``, else as dots
    css_class: str  # e.g. "predicted-curve", "measured-point"
    color: str = PALETTE[0]
    line: bool = True
    dashed: bool = False
    marker: str = "circle"  # for dots: circle or square
    data: dict = field(default_factory=dict)  # extra data-* attributes


def _nice_max(value: float) -> float:
    for step in (0.5, 1, 2, 2.5, 5, 10, 20, 50, 100):
        if value <= step * 5:
            return step * max(1, -(-value // step))
    return value


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    return [lo + (hi - lo) * i / n for i in range(n + 1)]


def line_chart(series: list[Series], *, x_label: str, y_label: str, x_range: tuple[float, float],
               y_max: float | None = None, hline: float | None = None, chart_id: str = "") -> str:
    """One SVG with axes, ticks, an optional dashed horizontal line (e.g. speedup 1), lines and dots."""
    ys = [y for s in series for _, y in s.points if y is not None]
    top = y_max if y_max is not None else _nice_max(max(ys + [hline or 0, 0.1]) * 1.1)
    x0, x1 = x_range
    x1 = x1 if x1 > x0 else x0 + 1
    left, right, up, down = MARGIN["left"], WIDTH - MARGIN["right"], MARGIN["top"], HEIGHT - MARGIN["bottom"]

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (right - left)

    def sy(y: float) -> float:
        return down - min(max(y, 0.0), top) / top * (down - up)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" class="lab-chart" '
           f'role="img" id="{escape(chart_id)}" font-family="sans-serif" font-size="11">',
           f'<rect x="{left}" y="{up}" width="{right - left}" height="{down - up}" fill="#fff" stroke="#cbd5e1"/>']
    for t in _ticks(0, top):
        out.append(f'<line x1="{left}" x2="{right}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eef2f7"/>'
                   f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for x in range(int(x0), int(x1) + 1):
        out.append(f'<text x="{sx(x):.1f}" y="{down + 16}" text-anchor="middle">{x}</text>')
    out.append(f'<text x="{(left + right) / 2}" y="{HEIGHT - 8}" text-anchor="middle">{escape(x_label)}</text>'
               f'<text x="14" y="{(up + down) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 14 {(up + down) / 2})">{escape(y_label)}</text>')
    if hline is not None:
        out.append(f'<line class="break-even" x1="{left}" x2="{right}" y1="{sy(hline):.1f}" y2="{sy(hline):.1f}" '
                   f'stroke="#64748b" stroke-dasharray="4 4"/>')
    for s in series:
        out.append(_series(s, sx, sy))
    out.append("</svg>")
    return "".join(out)


def _series(s: Series, sx, sy) -> str:
    data = "".join(f' data-{escape(k)}="{escape(str(v))}"' for k, v in s.data.items())
    head = f'<g class="{escape(s.css_class)}" data-label="{escape(s.label)}"{data}><title>{escape(s.label)}</title>'
    points = [(x, y) for x, y in s.points if y is not None]
    if s.line:
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
        dash = ' stroke-dasharray="6 3"' if s.dashed else ""
        return f'{head}<polyline points="{path}" fill="none" stroke="{s.color}" stroke-width="2"{dash}/></g>'
    if s.marker == "square":
        dots = "".join(f'<rect x="{sx(x) - 4:.1f}" y="{sy(y) - 4:.1f}" width="8" height="8" fill="{s.color}"/>'
                       for x, y in points)
    else:
        dots = "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4.5" fill="{s.color}" stroke="#fff"/>'
                       for x, y in points)
    return head + dots + "</g>"


def legend(items: list[tuple[str, str, str]]) -> str:
    """(color, label, style) rows as HTML; style is "line", "dashed" or "dot"."""
    rows = []
    for color, label, style in items:
        mark = {"line": f"border-top:2px solid {color}", "dashed": f"border-top:2px dashed {color}",
                "dot": f"background:{color};border-radius:50%;height:9px"}[style]
        rows.append(f'<span class="lab-legend-item"><i style="display:inline-block;width:16px;{mark}"></i> '
                    f"{escape(label)}</span>")
    return f'<div class="lab-legend">{"".join(rows)}</div>'
