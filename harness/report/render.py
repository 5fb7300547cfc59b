"""Render a built Table as Markdown, LaTeX (booktabs), HTML and CSV, in the paper's layout.

Rows are grouped by model (the model label only on a group's first row); each metric has our value
and, for tables the paper reports numbers for, the paper's value and Δ = ours - paper. Cells the
results do not cover are marked (MISSING; "--" in LaTeX), never filled.
"""
from __future__ import annotations

import html
import io
from typing import Any, Callable

import pandas as pd

from harness.report.build import Cell, Row, Table
from harness.report.cells import SETTING
from harness.report.specs import MISSING, MetricSpec, swept_label

LATEX_MISSING = "--"
_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "×": r"$\times$", "τ": r"$\tau$", "δ": r"$\delta$", "Δ": r"$\Delta$", "↑": r"$\uparrow$",
                  "↓": r"$\downarrow$", "—": "--", "§": r"\S{}", "≈": r"$\approx$", "±": r"$\pm$"}
LEGEND = f"{MISSING}: not covered by the results (ours) or not reported (paper)."
DELTA_LEGEND = "Δ = ours - paper, in the paper's units."
INTERVAL_LEGEND = ("[low, high]: 95% confidence interval of our value (speed-ups: bootstrap over the timed "
                   "images and their repetitions, paired with raster; docs/methodology.md).")


def format_value(value: float | None, metric: MetricSpec, missing: str = MISSING) -> str:
    """`value` with the metric's decimals and suffix; `missing` for None."""
    return missing if value is None else f"{value:.{metric.decimals}f}{metric.suffix}"


def format_ours(cell: Cell, metric: MetricSpec, missing: str = MISSING) -> str:
    """Our value as `format_value`, followed by its confidence interval "[low, high]" when the
    results give one (speed-ups), or by "± stderr" for metrics shown with their error."""
    text = format_value(cell.ours, metric, missing)
    if cell.ours is None:
        return text
    if cell.ci_low is not None and cell.ci_high is not None:
        return f"{text} [{cell.ci_low:.{metric.decimals}f}, {cell.ci_high:.{metric.decimals}f}]"
    if metric.error and cell.stderr is not None:
        return f"{text} ± {cell.stderr:.{metric.decimals}f}"
    return text


def has_intervals(table: Table) -> bool:
    """True when some cell of `table` shows a confidence interval."""
    return any(c.ours is not None and c.ci_low is not None for r in table.rows for c in r.cells.values())


def format_delta(value: float | None, metric: MetricSpec, missing: str = MISSING) -> str:
    """A signed difference with the metric's decimals (no suffix)."""
    if value is None:
        return missing
    rounded = round(value, metric.decimals) + 0.0  # + 0.0 turns -0.0 into 0.0
    return f"{rounded:+.{metric.decimals}f}"


def shown_delta(cell: Cell, metric: MetricSpec) -> float | None:
    """Δ of the shown numbers: our value rounded as printed, minus the paper's (as printed), so
    the printed Δ is exactly the difference of the printed values."""
    if cell.ours is None or cell.paper is None:
        return None
    return round(cell.ours, metric.decimals) - cell.paper


def header(metric: MetricSpec) -> str:
    """Metric header with the better direction."""
    return f"{metric.label} {'↑' if metric.higher_is_better else '↓'}"


def key_headers(table: Table) -> list[str]:
    """Model, method and the swept keys (a row's setting is part of its method label instead)."""
    return ["Model", "Method", *(swept_label(c) for c in table.swept if c != SETTING)]


def key_cells(table: Table, row: Row, previous: Row | None) -> list[str]:
    """Model label (blank when it repeats the previous row's), method label, swept values."""
    model = "" if previous is not None and previous.model == row.model else row.model_label
    return [model, row.method_label, *(_swept_text(v) for c, v in zip(table.swept, row.swept) if c != SETTING)]


def value_cells(table: Table, row: Row, missing: str = MISSING) -> list[str]:
    """Per metric: ours [, paper, Δ]; a published row's value (cell.paper) in a field table."""
    out: list[str] = []
    for metric in table.metrics:
        cell = row.cells[metric.key]
        out.append(format_value(cell.paper, metric, missing) if row.published else format_ours(cell, metric, missing))
        if table.with_paper:
            out += [format_value(cell.paper, metric, missing), format_delta(shown_delta(cell, metric), metric, missing)]
    return out


def notes(table: Table) -> list[str]:
    """Lines printed under the table: the paper's conclusion, the legend, derived speed-ups."""
    lines = [table.spec.note] if table.spec.note else []
    lines.append(LEGEND + (" " + DELTA_LEGEND if table.with_paper else ""))
    if has_intervals(table):
        lines.append(INTERVAL_LEGEND)
    if any(c.derived_from for r in table.rows for c in r.cells.values()):
        lines.append("Some speed-ups divide by the raster latency of another run of the same experiment "
                     "(column speedup_raster_run of the sources CSV).")
    return lines


def to_markdown(table: Table) -> str:
    """A Markdown section: title, padded table, notes."""
    headers = key_headers(table)
    for metric in table.metrics:
        headers += [header(metric), "paper", "Δ"] if table.with_paper else [header(metric)]
    rows = [key_cells(table, row, prev) + value_cells(table, row)
            for row, prev in zip(table.rows, (None, *table.rows[:-1]))]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    keys = len(key_headers(table))

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if i < keys else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "|" + "|".join("-" * (w + 2) if i < keys else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"
    body = [line(headers), rule, *(line(r) for r in rows)]
    return "\n".join([f"### {table.spec.title}", "", *body, "", *notes(table)]) + "\n"


def latex_escape(text: str) -> str:
    """`text` with LaTeX's special characters escaped and symbols in math mode."""
    return "".join(_LATEX_SPECIAL.get(char, char) for char in text)


def to_latex(table: Table) -> str:
    """A booktabs `table` float: two header rows (metric, then ours/paper/Δ) when the paper has numbers."""
    keys = len(key_headers(table))
    per = 3 if table.with_paper else 1
    lines = ["% Generated by `python -m harness.tables` from the results store; regenerate, do not edit.",
             r"\begin{table}[t]", r"\centering", r"\small",
             r"\begin{tabular}{" + "l" * keys + "r" * (per * len(table.metrics)) + "}", r"\toprule"]
    names = [latex_escape(h) for h in key_headers(table)]
    if table.with_paper:
        tops = [rf"\multicolumn{{3}}{{c}}{{{latex_escape(header(m))}}}" for m in table.metrics]
        rules = "".join(rf"\cmidrule(lr){{{keys + 1 + per * i}-{keys + per * (i + 1)}}}" for i in range(len(tops)))
        lines += [" & ".join(names + tops) + r" \\", rules,
                  " & ".join([""] * keys + ["Ours", "Paper", r"$\Delta$"] * len(table.metrics)) + r" \\"]
    else:
        lines.append(" & ".join(names + [latex_escape(header(m)) for m in table.metrics]) + r" \\")
    lines.append(r"\midrule")
    previous: Row | None = None
    for row in table.rows:
        if previous is not None and previous.model != row.model:
            lines.append(r"\midrule")
        cells = [latex_escape(c) for c in key_cells(table, row, previous)]
        cells += [_latex_number(c) for c in value_cells(table, row, LATEX_MISSING)]
        lines.append(" & ".join(cells) + r" \\")
        previous = row
    caption = " ".join([table.spec.title + ".", *notes(table)])
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{latex_escape(caption)}}}",
              rf"\label{{tab:{table.spec.name.replace('_', '-')}}}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def column_definitions(table: Table) -> list[tuple[str, str]]:
    """(header, what the column holds) for every column of the table as shown: the report's legend
    and its headers' tooltips."""
    swept = [c for c in table.swept if c != SETTING]
    out = [("Model", "the model the images come from (config group model)."),
           ("Method", ("the decoder (config group decoder). A setting in parentheses, e.g. (k=32, δ=0.4, "
                       "on_reject=pooled), is where the row ran otherwise than in the paper: the model's "
                       "operating point on its world or an override (docs/configuration.md, \"Operating "
                       "points\"); the paper's values are compared only at the paper's setting.")),
           *((swept_label(c), f"the value of config key {c} in the run that made the row.") for c in swept)]
    for metric in table.metrics:
        better = "higher is better" if metric.higher_is_better else "lower is better"
        out.append((header(metric), f"{metric.definition or metric.metric} ({better})"))
    if table.with_paper:
        out += [("ours", "the value measured here, from the runs listed on the page."),
                ("paper", "the paper's value for this model and method (harness/data/paper_numbers.csv)."),
                ("Δ", "ours − paper, in the paper's units (green: ours better, red: worse).")]
    return out


def to_html(table: Table) -> str:
    """An HTML <table> (with a caption, notes and a legend defining every column, also the headers'
    tooltips) for the static report; Δ cells are classed "better"/"worse" by the metric's
    direction, uncovered cells "missing"."""
    keys = key_headers(table)
    defined = dict(column_definitions(table))

    def th(text: str, span: str = "") -> str:
        tip = f' title="{html.escape(defined[text])}"' if text in defined else ""
        return f"<th{span}{tip}>{html.escape(text)}</th>"

    out = [f'<table class="results"><caption>{html.escape(table.spec.title)}</caption><thead>']
    if table.with_paper:
        out.append("<tr>" + "".join(th(h, ' rowspan="2"') for h in keys)
                   + "".join(th(header(m), ' colspan="3"') for m in table.metrics) + "</tr>")
        out.append("<tr>" + f"{th('ours')}{th('paper')}{th('Δ')}" * len(table.metrics) + "</tr>")
    else:
        out.append("<tr>" + "".join(th(h) for h in keys + [header(m) for m in table.metrics]) + "</tr>")
    out.append("</thead><tbody>")
    for row, previous in zip(table.rows, (None, *table.rows[:-1])):
        cells = [f"<td>{html.escape(c)}</td>" for c in key_cells(table, row, previous)]
        for metric in table.metrics:
            cells += _html_cells(row.cells[metric.key], metric, table.with_paper, row.published)
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    out += [f'<p class="note">{html.escape(line)}</p>' for line in notes(table)]
    out.append('<dl class="legend">' + "".join(f"<dt>{html.escape(name)}</dt><dd>{html.escape(text)}</dd>"
                                                for name, text in column_definitions(table)) + "</dl>")
    return "\n".join(out) + "\n"


def to_csv(table: Table) -> str:
    """The paper's layout as CSV: key columns, then per metric ours [, paper, delta]; full precision,
    empty where uncovered; `<metric>_ci_low` / `_ci_high` beside metrics with confidence intervals."""
    with_ci = {m.key for m in table.metrics if any(r.cells[m.key].ci_low is not None for r in table.rows)}
    records = []
    for row in table.rows:
        record: dict[str, Any] = {"model": row.model, "decoder": row.decoder, "model_label": row.model_label,
                                  "method_label": row.method_label, **dict(zip(table.swept, row.swept))}
        if table.spec.published_rows:
            record["published"] = row.published
        for metric in table.metrics:
            cell = row.cells[metric.key]
            record[metric.key] = cell.paper if row.published else cell.ours
            if metric.key in with_ci:
                record[f"{metric.key}_ci_low"], record[f"{metric.key}_ci_high"] = cell.ci_low, cell.ci_high
            if table.with_paper:
                record[f"{metric.key}_paper"], record[f"{metric.key}_delta"] = cell.paper, cell.delta
        records.append(record)
    return _csv(records)


def to_sources_csv(table: Table) -> str:
    """One line per (row, metric): every shown value with the run or paper row it comes from."""
    records = [{"table": table.spec.name, "model": row.model, "decoder": row.decoder,
                **({"published": row.published} if table.spec.published_rows else {}),
                **dict(zip(table.swept, row.swept)), "metric": metric.key, "ours": cell.ours,
                "ours_stderr": cell.stderr, "ours_ci_low": cell.ci_low, "ours_ci_high": cell.ci_high,
                "n": cell.n, "paper": cell.paper, "delta": cell.delta,
                "run_dir": cell.run_dir, "speedup_raster_run": cell.derived_from, "paper_source": cell.source}
               for row in table.rows for metric in table.metrics for cell in [row.cells[metric.key]]]
    return _csv(records)


def _html_cells(cell: Cell, metric: MetricSpec, with_paper: bool, published: bool = False) -> list[str]:
    """<td>s of one metric: ours [, paper, Δ]; a published row's value, titled with its source."""
    def td(text: str, css: str = "") -> str:
        css = "missing" if text == MISSING else css
        return f'<td class="{css}">{html.escape(text)}</td>' if css else f"<td>{html.escape(text)}</td>"

    if published:
        tip = f' title="{html.escape(cell.source)}"' if cell.source else ""
        return [td(format_value(cell.paper, metric)) if cell.paper is None
                else f'<td class="paper"{tip}>{html.escape(format_value(cell.paper, metric))}</td>']

    out = [td(format_ours(cell, metric))]
    if with_paper:
        delta = shown_delta(cell, metric)
        rounded = None if delta is None else round(delta, metric.decimals)
        better = "" if not rounded else ("better" if (rounded > 0) == metric.higher_is_better else "worse")
        out += [td(format_value(cell.paper, metric), "paper"), td(format_delta(delta, metric), better)]
    return out


def _latex_number(text: str) -> str:
    """A value cell in LaTeX: a typeset minus sign, symbols escaped."""
    if text == LATEX_MISSING:
        return text
    if text.startswith("-"):
        return "$-$" + latex_escape(text[1:])
    return latex_escape(text)


def _swept_text(value: Any) -> str:
    """A swept-key value: numbers without trailing zeros; empty when the row has none."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _csv(records: list[dict[str, Any]]) -> str:
    """CSV text; floats rounded to 10 decimals (no binary noise), counts as integers."""
    frame = pd.DataFrame(records)
    for column in frame.columns:
        if column == "n":
            frame[column] = frame[column].astype("Int64")
        elif frame[column].dtype.kind == "f":
            frame[column] = frame[column].round(10)
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False, lineterminator="\n")
    return buffer.getvalue()


Renderer = Callable[[Table], str]
FORMATS: dict[str, tuple[str, Renderer]] = {"md": (".md", to_markdown), "tex": (".tex", to_latex),
                                            "csv": (".csv", to_csv), "sources": ("_sources.csv", to_sources_csv)}

__all__ = ["FORMATS", "column_definitions", "format_delta", "format_ours", "format_value", "has_intervals", "latex_escape", "to_csv",
           "to_html", "to_latex", "to_markdown", "to_sources_csv"]
