"""Assemble one paper table: rows in the paper's order with our value, the paper's and the difference.

Rows come from the results (model, decoder, swept keys) and, for tables the paper reports numbers
for, from the paper's facts too, so a method the results do not cover still shows the paper's value
next to a marked empty cell. The field's tables (TableSpec.published_rows) show the published facts
as rows of their own, before the harness's. Nothing is filled in: a cell is a measured or published
value, or None.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from harness.report.paper_reference import paper_labels
from harness.report.cells import DERIVED_FROM, SETTING, select_cells
from harness.report.specs import METHOD_LABELS, MODEL_LABELS, MetricSpec, TableSpec


@dataclass(frozen=True, slots=True)
class Cell:
    """Our value (shown unit), the paper's, and where each comes from; None where absent."""

    ours: float | None = None
    paper: float | None = None
    stderr: float | None = None
    ci_low: float | None = None  # our value's confidence interval (speed-ups: harness/run.py)
    ci_high: float | None = None
    n: int | None = None
    run_dir: str | None = None
    derived_from: str | None = None
    source: str | None = None

    @property
    def delta(self) -> float | None:
        """ours - paper, when both exist."""
        return None if self.ours is None or self.paper is None else self.ours - self.paper


@dataclass(frozen=True, slots=True)
class Row:
    """One table row: its keys, labels and one Cell per metric key."""

    model: str
    decoder: str
    swept: tuple[Any, ...]
    model_label: str
    method_label: str
    cells: dict[str, Cell]
    published: bool = False  # a row of published numbers (each cell's `paper`), not of the results


@dataclass(frozen=True, slots=True)
class Table:
    """A built table. `with_paper`: the paper has numbers for it (paper and Δ columns are shown)."""

    spec: TableSpec
    metrics: tuple[MetricSpec, ...]
    swept: tuple[str, ...]
    rows: tuple[Row, ...]
    with_paper: bool

    @property
    def runs(self) -> list[str]:
        """The run directories whose values appear in the table, sorted."""
        return sorted({c.run_dir for r in self.rows for c in r.cells.values() if c.run_dir})

    def is_empty(self) -> bool:
        """True when no row has a regenerated value."""
        return not any(c.ours is not None for r in self.rows for c in r.cells.values())


def build_table(frame: pd.DataFrame, spec: TableSpec, facts: pd.DataFrame, paper_rows: bool = True) -> Table:
    """Build `spec` from the merged results `frame` (after `with_derived_speedup`) and the facts.

    Args:
        paper_rows: also add the paper's (model, method) rows that the results do not cover.
    """
    cells, swept = select_cells(frame, spec.experiments, spec.metrics)
    published = facts[facts["table"] == spec.paper_table] if spec.paper_table else facts.iloc[:0]
    paper = published.iloc[:0] if spec.published_rows else published  # the facts beside our values
    keys = _row_keys(cells, swept, paper, paper_rows)
    keys = _ordered(keys, spec, list(paper["model"].drop_duplicates()), list(paper["decoder"].drop_duplicates()))
    metrics = spec.metrics
    if spec.drop_empty_metrics:
        metrics = tuple(m for m in metrics if (cells["key"] == m.key).any())
    bases, methods = paper_labels(facts, "main")
    at = swept.index(SETTING) if SETTING in swept else None
    labels = methods if spec.paper_table else {}
    rows = tuple(
        Row(model=model, decoder=decoder, swept=tuple(values),
            model_label=bases.get(model) or MODEL_LABELS.get(model, model),
            method_label=_with_setting(_method_label(spec, model, decoder, labels), None if at is None else values[at]),
            cells={m.key: _cell(cells, swept, (model, decoder, *values), m.key, paper) for m in metrics})
        for model, decoder, *values in keys
    )
    if spec.published_rows and paper_rows:
        rows = published_rows(spec, published, metrics, len(swept)) + rows
    return Table(spec=spec, metrics=metrics, swept=tuple(swept), rows=rows,
                 with_paper=spec.paper_table is not None and not spec.published_rows)


def published_rows(spec: TableSpec, facts: pd.DataFrame, metrics: tuple[MetricSpec, ...], swept: int) -> tuple[Row, ...]:
    """One row per published (model, decoder) of `facts` (one table's): models in the facts' order,
    methods in the spec's order; each cell's `paper` holds the published value and `source` where it
    was read (None where the publication reports none)."""
    bases, methods = paper_labels(facts, str(spec.paper_table))
    pairs = list(dict.fromkeys(zip(facts["model"], facts["decoder"])))
    order = [d for d, _ in spec.methods]
    models = list(dict.fromkeys(m for m, _ in pairs))
    pairs.sort(key=lambda p: (models.index(p[0]), order.index(p[1]) if p[1] in order else len(order)))
    return tuple(
        Row(model=model, decoder=decoder, swept=(None,) * swept, model_label=f"{bases[model]} (published)",
            method_label=methods[(model, decoder)], published=True,
            cells={m.key: _fact_cell(facts, model, decoder, m.key) for m in metrics})
        for model, decoder in pairs
    )


def _row_keys(cells: pd.DataFrame, swept: list[str], paper: pd.DataFrame, paper_rows: bool) -> list[tuple]:
    """(model, decoder, *swept values) of every result row, then the paper's uncovered rows."""
    keys = [tuple(_clean(v) for v in key) for key in cells[["model", "decoder", *swept]].itertuples(index=False)]
    keys = list(dict.fromkeys(keys))
    if paper_rows:
        covered = {key[:2] for key in keys}
        for model, decoder in paper[["model", "decoder"]].drop_duplicates().itertuples(index=False):
            if (model, decoder) not in covered:
                keys.append((model, decoder, *([None] * len(swept))))
    return keys


def _ordered(keys: list[tuple], spec: TableSpec, paper_models: list[str], paper_decoders: list[str]) -> list[tuple]:
    """Models in the paper's order then first seen; methods in the spec's order; swept values ascending."""
    models = list(dict.fromkeys([m for m in paper_models if any(k[0] == m for k in keys)] + [k[0] for k in keys]))
    decoders = list(dict.fromkeys([d for d, _ in spec.methods] + paper_decoders + [k[1] for k in keys]))

    def rank(key: tuple) -> tuple:
        return (models.index(key[0]), decoders.index(key[1]), *(_sortable(v) for v in key[2:]))

    return sorted(keys, key=rank)


def _cell(cells: pd.DataFrame, swept: list[str], key: tuple, metric: str, paper: pd.DataFrame) -> Cell:
    """The Cell of row `key` and `metric`."""
    match = cells["key"] == metric
    for column, value in zip(["model", "decoder", *swept], key):
        match &= cells[column].isna() if value is None else cells[column] == value
    fact = paper[(paper["model"] == key[0]) & (paper["decoder"] == key[1]) & (paper["metric"] == metric)]
    found: dict[str, Any] = {}
    if match.any():
        row = cells[match].iloc[0]
        found = {"ours": _number(row["value"]), "stderr": _number(row["stderr"]), "n": _count(row["n"]),
                 "ci_low": _number(row.get("ci_low")), "ci_high": _number(row.get("ci_high")),
                 "run_dir": str(row["run_dir"]), "derived_from": _clean(row.get(DERIVED_FROM))}
    if not fact.empty:
        found.update(paper=float(fact["value"].iloc[0]), source=str(fact["source"].iloc[0]))
    return Cell(**found)


def _fact_cell(facts: pd.DataFrame, model: str, decoder: str, metric: str) -> Cell:
    """A published value as a Cell (`paper` and `source`; empty where not reported)."""
    fact = facts[(facts["model"] == model) & (facts["decoder"] == decoder) & (facts["metric"] == metric)]
    if fact.empty:
        return Cell()
    return Cell(paper=float(fact["value"].iloc[0]), source=str(fact["source"].iloc[0]))


def _method_label(spec: TableSpec, model: str, decoder: str, paper_methods: dict[tuple[str, str], str]) -> str:
    """The paper's label for this (model, decoder), else the spec's, else the generic one."""
    return (paper_methods.get((model, decoder)) or dict(spec.methods).get(decoder)
            or METHOD_LABELS.get(decoder, decoder))


def _with_setting(label: str, setting: Any) -> str:
    """The method's label, followed by its setting where the row ran otherwise than in the paper
    (e.g. "LANTERN (k=32, δ=0.4, on_reject=pooled)")."""
    return f"{label} ({setting})" if setting else label


def _clean(value: Any) -> Any:
    """None for NaN/None; plain Python scalars otherwise."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return None
    return value.item() if hasattr(value, "item") else value


def _number(value: Any) -> float | None:
    value = _clean(value)
    return None if value is None else float(value)


def _count(value: Any) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def _sortable(value: Any) -> tuple:
    """Unset first, then numbers ascending, then text."""
    if value is None:
        return (0, 0.0, "")
    try:
        return (1, float(value), "")
    except (TypeError, ValueError):
        return (2, 0.0, str(value))


__all__ = ["Cell", "Row", "Table", "build_table"]
