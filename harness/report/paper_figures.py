"""Which figures an experiment gets, and their data, from the merged results (harness.report.figures draws).

Per (experiment, model): the speed-quality figure (a curve per swept τ series, a point per other
method, the paper's points for that model), the rejection heatmaps of its drafting methods, an
image grid of the same prompts and seeds across its methods and, for its MuLo-SD rows, the redraw
panels and the one-pass tau curve (harness/report/redraw_figures.py). The tau_sweep experiment also takes
the methods of experiment `main` as baseline points.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

import pandas as pd

from harness.report import figures
from harness.report.figures import PAPER_SUFFIX, Panel, Point
from harness.report.redraw_figures import mulo_figures
from harness.store.samples import SampleSet
from harness.report.build import Cell, Row, Table, build_table
from harness.report.cells import SETTING
from harness.report.specs import DPG_BENCH, FID, GENEVAL, HPSV2, SPEEDUP, TableSpec, spec_for, swept_label

log = logging.getLogger(__name__)

BASELINE_SOURCES = {"tau_sweep": ("main",)}
QUALITY = (GENEVAL, FID, HPSV2, DPG_BENCH)
Z95 = 1.959964  # standard normal quantile of a two-sided 95% interval


def experiment_figures(frame: pd.DataFrame, facts: pd.DataFrame, experiment: str, folder: Path,
                       grid_images: int = 6) -> list[tuple[str, Path]]:
    """Draw every figure of `experiment` into `folder`; return (caption, PNG path) pairs."""
    table = _figure_table(frame, facts, experiment)
    written: list[tuple[str, Path]] = []
    for model in dict.fromkeys(row.model for row in table.rows):
        rows = [row for row in table.rows if row.model == model]
        label = rows[0].model_label
        own = [row for row in rows if _in_experiment(row, frame, experiment)]
        baseline = ", ".join(BASELINE_SOURCES.get(experiment, ()))
        sources = {id(row): f" ({baseline})" if baseline and all(row is not o for o in own) else ""
                   for row in rows}
        caption = (f"Speed-quality trade-off, {label}. Bars: 95% intervals (speed-up, horizontal: "
                   f"{figures.SPEEDUP_INTERVAL}; quality, vertical: {figures.QUALITY_INTERVAL})")
        written += _try(caption, lambda: figures.speed_quality(
            _points(rows, table, facts, model, sources), f"{experiment}: {label}", folder / f"speed_quality_{model}"))
        panels = [Panel(_row_label(row, table), SampleSet(figures.samples_root(run) / row.decoder))
                  for row in own for run in [_run_of(row)] if run]
        maps = [(p.label, m) for p in panels for m in [figures.heatmap_of(p.samples)] if m is not None]
        written += _try(f"Mean rejections per token position, {label}", lambda: figures.rejection_heatmaps(
            maps, f"{experiment}: {label}", folder / f"rejections_{model}"))
        present = [p for p in panels if p.samples.root.is_dir()]
        written += _try(f"Same prompts and seeds across methods, {label}", lambda: figures.image_grid(
            present, f"{experiment}: {label}", folder / f"samples_{model}", grid_images))
        raster = next((SampleSet(figures.samples_root(run) / row.decoder) for row in own
                       if row.decoder == "raster" for run in [_run_of(row)] if run), None)
        written += mulo_figures(present, model, label, experiment, folder, raster, grid_images)
    return written


def _figure_table(frame: pd.DataFrame, facts: pd.DataFrame, experiment: str) -> Table:
    """The experiment's rows (plus baseline experiments) with speed-up and quality metrics."""
    base = spec_for(experiment)
    spec = TableSpec(name=base.name, title=base.title, methods=base.methods, metrics=(SPEEDUP, *QUALITY),
                     experiments=(experiment, *BASELINE_SOURCES.get(experiment, ())), paper_table=base.paper_table)
    return build_table(frame, spec, facts, paper_rows=False)


def _points(rows: list[Row], table: Table, facts: pd.DataFrame, model: str,
            sources: dict[int, str]) -> dict[str, list[Point]]:
    """Per quality metric: our points (τ series where a tau column is swept) and the paper's.
    `sources` maps id(row) to a label suffix naming the baseline experiment it comes from."""
    tau_at = next((i for i, c in enumerate(table.swept) if c.rsplit(".", 1)[-1] == "tau"), None)
    out: dict[str, list[Point]] = {}
    for metric in QUALITY:
        points = []
        for row in rows:
            speed, quality = row.cells["speedup"].ours, row.cells[metric.key].ours
            if speed is None or quality is None:
                continue
            tau = row.swept[tau_at] if tau_at is not None else None
            others = [(c, v) for i, (c, v) in enumerate(zip(table.swept, row.swept))
                      if i != tau_at and v is not None and c != SETTING]  # the setting is in the label
            name = " ".join([row.method_label, *(f"{swept_label(c)}={v:g}" if isinstance(v, float) else
                                                 f"{swept_label(c)}={v}" for c, v in others)]) + sources[id(row)]
            cell = row.cells["speedup"]
            interval = (cell.ci_low, cell.ci_high) if cell.ci_low is not None and cell.ci_high is not None else None
            points.append(Point(label=name, speedup=speed, quality=quality, speedup_ci=interval,
                                quality_ci=_quality_interval(row.cells[metric.key]),
                                series=name if tau is not None else None, tau=None if tau is None else float(tau)))
        paper = facts[(facts["model"] == model) & (facts["table"] == "main")]
        for method, group in paper.groupby("method", sort=False):
            values = dict(zip(group["metric"], group["value"]))
            if "speedup" in values and metric.key in values:
                points.append(Point(label=f"{method}{PAPER_SUFFIX}", speedup=values["speedup"],
                                    quality=values[metric.key], paper=True))
        out[metric.key] = points
    return out


def _quality_interval(cell: Cell) -> tuple[float, float] | None:
    """A quality value's 95% interval: its own where the results give one, else ± 1.96 standard
    errors (None where the results give neither)."""
    if cell.ours is None:
        return None
    if cell.ci_low is not None and cell.ci_high is not None:
        return cell.ci_low, cell.ci_high
    if cell.stderr is None or not math.isfinite(cell.stderr):
        return None
    return cell.ours - Z95 * cell.stderr, cell.ours + Z95 * cell.stderr


def _in_experiment(row: Row, frame: pd.DataFrame, experiment: str) -> bool:
    """True when the row's values come from `experiment` itself (not from a baseline source)."""
    run = _run_of(row)
    return run is not None and bool(((frame["run_dir"] == run) & (frame["experiment"] == experiment)).any())


def _run_of(row: Row) -> str | None:
    """The run directory of a row (from its speed-up, else any metric)."""
    cells = [row.cells.get("speedup"), *row.cells.values()]
    return next((c.run_dir for c in cells if c is not None and c.run_dir), None)


def _row_label(row: Row, table: Table) -> str:
    """Method label plus swept values, e.g. "MuLo-SD k=4 τ=0.1"."""
    parts = [f"{swept_label(c)}={v:g}" if isinstance(v, float) else f"{swept_label(c)}={v}"
             for c, v in zip(table.swept, row.swept) if v is not None and c != SETTING]
    return " ".join([row.method_label, *parts])


def _try(caption: str, draw: object) -> list[tuple[str, Path]]:
    """Run a figure function; a figure without data is skipped with a log line, not an error."""
    try:
        paths = draw()  # type: ignore[operator]
    except ValueError as err:
        log.info("figure skipped (%s): %s", caption, err)
        return []
    return [(caption, next(p for p in paths if p.suffix == ".png"))]


__all__ = ["experiment_figures"]
