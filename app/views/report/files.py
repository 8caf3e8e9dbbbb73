"""An experiment's files: the JSON (everything, reloadable; the commands in the table read their prompts from
it), the table as CSV, and a self-contained HTML report (inline CSS and SVG, no script, no network) that shows
the run later without the models."""
from __future__ import annotations

import csv
import io
import json
from html import escape
from pathlib import Path

from app.views.report.views import HEADERS, TABLE_COLUMNS, acceptance_chart, cell_text, doctor_html, speedup_chart
from engine.errors import InvalidSettingError
from engine.surface import COLUMNS, RESULT_VERSION, ExperimentGrid

CSV_COLUMNS = (*COLUMNS, "target_precision_used", "draft_precision_used", "series", "mean_k", "prompts", "seconds",
               "acceptance_by_position")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what makes a spreadsheet read a cell as a formula (OWASP)
REPORT_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#0f172a;max-width:1200px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}th,td{border:1px solid #cbd5e1;padding:3px 6px;
text-align:left;vertical-align:top}th{background:#f1f5f9}code{font-size:11px;word-break:break-all}
.lab-plot svg{max-width:720px;width:100%;height:auto}.lab-legend{font-size:12px;display:flex;flex-wrap:wrap;gap:4px 14px}
.race-ok{color:#059669}.race-bad{color:#dc2626}.meta{color:#475569;font-size:13px}pre{white-space:pre-wrap;font-size:12px}
"""


def load_result(path: str | Path) -> dict:
    """A saved run; a file that is not one says so."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InvalidSettingError(f"could not read the saved experiment {Path(path).name!r}: {err}") from err
    if not isinstance(data, dict) or data.get("version") != RESULT_VERSION or not isinstance(data.get("rows"), list):
        raise InvalidSettingError(f"{Path(path).name!r} is not a saved SpecLens experiment (version {RESULT_VERSION})")
    ExperimentGrid.from_dict(data.get("grid") or {})  # its grid must still be valid
    return data


def csv_cell(value):
    """A value as a CSV cell: a list or dict as JSON; a string that a spreadsheet would run as a formula (it starts
    with one of FORMULA_STARTS: a model name, a prompt set, a loaded file's text) gets a leading ``'``, as OWASP
    advises against CSV injection. Numbers stay numbers, negative ones included."""
    if isinstance(value, (list, dict)):
        value = json.dumps(value)
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def rows_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for r in rows:
        writer.writerow([csv_cell(r.get(c)) for c in CSV_COLUMNS])
    return out.getvalue()


def _table(rows: list[dict]) -> str:
    head = "".join(f"<th>{escape(HEADERS[c])}</th>" for c in TABLE_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{escape(cell_text(r, c))}</td>" for c in TABLE_COLUMNS) + "</tr>"
                   for r in rows)
    return f'<table class="lab-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _one_line(css: str) -> str:
    """The stylesheet on one line: a report is a file to open, not to read as source."""
    return " ".join(css.split())


def report_html(result: dict) -> str:
    rows, grid, machine = result["rows"], result["grid"], result.get("machine", {})
    commands = "".join(f"<li>{escape(r['cell'])}<br><code>{escape(r['command'])}</code></li>" for r in rows)
    prompts = "".join(f"<h3>{escape(s)}</h3><ol>" + "".join(f"<li><pre>{escape(p)}</pre></li>" for p in ps) + "</ol>"
                      for s, ps in result.get("prompts", {}).items())
    stopped = " · <b>stopped before the end</b>" if result.get("stopped") else ""
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>SpecLens experiment {escape(result["created"])}'
            f"</title><style>{_one_line(REPORT_CSS)}</style></head><body><h1>SpecLens experiment</h1>"
            f'<p class="meta">{escape(result["created"])} · {len(rows)} cells · {result.get("seconds", 0):.0f} s{stopped}'
            f"<br>target {escape(grid['target'])} · machine: {escape(machine.get('cpu', ''))}, "
            f"{escape(machine.get('kind', ''))}, {machine.get('threads', '?')} threads, torch "
            f"{escape(machine.get('torch', ''))} · seed {grid['seed']} · {grid['max_new_tokens']} new tokens per prompt</p>"
            f"<h2>Results</h2>{_table(rows)}"
            f"<p class=\"meta\">speedup: tokens/s over target-only on the same prompts and temperature; predicted: the "
            f"cost model for the cell's measured α; follows target (p): a chi-square of the sampled tokens' "
            f"randomized PIT under the target's distribution (✓ when p ≥ 0.01).</p>"
            f"<h2>Speedup against k</h2>{speedup_chart(rows)}<h2>Acceptance by draft position</h2>"
            f"{acceptance_chart(rows)}{doctor_html(result.get('doctor'), rows)}"
            f"<h2>Reproduce a cell</h2><ol>{commands}</ol><h2>Prompts</h2>{prompts}</body></html>")


def save_result(result: dict, folder: str | Path) -> dict[str, Path]:
    """experiment.json (the name the rows' commands read), .csv and .html in ``folder``. The JSON first: a long
    run's data must survive whatever comes after."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {kind: folder / f"experiment.{kind}" for kind in ("json", "csv", "html")}
    paths["json"].write_text(json.dumps(result, indent=1))
    paths["csv"].write_text(rows_csv(result["rows"]))
    paths["html"].write_text(report_html(result))
    return paths
