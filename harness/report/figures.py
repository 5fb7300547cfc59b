"""The paper's figures from the results store (matplotlib, PNG + PDF).

- speed_quality: quality against speed-up; each tau sweep is a line (points annotated with τ),
  every other method a point, the paper's numbers for the model as hollow markers; each of our
  points has its 95% intervals as error bars (speed-up horizontal, quality vertical) and the points
  are listed in words beside the figure (<stem>.txt: the page's description of the figure);
- rejection_heatmaps: the mean rejections per token position of each drafting method, on the
  token grid, one panel per method with a shared colour scale;
- image_grid: the same prompts and seeds (same sample ids) across methods, methods as rows.

Figures use matplotlib's object API (no pyplot state) and are written atomically.
"""
from __future__ import annotations

import io
import json
import logging
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from harness.report.rejections import rejection_heatmap
from harness.store.samples import SampleSet, write_atomic

log = logging.getLogger(__name__)

FORMATS = ("png", "pdf")
QUALITY_LABELS = {"geneval": "GenEval ↑", "fid": "FID ↓", "hpsv2": "HPSv2 ↑", "dpg_bench": "DPG-Bench ↑"}
MAX_PANELS = 12
PAPER_SUFFIX = " (paper)"
SPEEDUP_INTERVAL = "bootstrap over the timed images and their repetitions, paired with raster"
QUALITY_INTERVAL = "± 1.96 standard errors of the score (GenEval: over the images of each tag)"
_MARKERS = "sD^vP*Xph<>"


@dataclass(frozen=True, slots=True)
class Point:
    """One method's operating point: `series` groups points into a curve (None: a lone point)."""

    label: str
    speedup: float
    quality: float
    series: str | None = None
    tau: float | None = None
    paper: bool = False
    speedup_ci: tuple[float, float] | None = None  # the speed-up's 95% interval: a horizontal error bar
    quality_ci: tuple[float, float] | None = None  # the quality's 95% interval: a vertical error bar


@dataclass(frozen=True, slots=True)
class Panel:
    """A labelled SampleSet (one method of one model)."""

    label: str
    samples: SampleSet


def save(figure: Figure, stem: Path) -> list[Path]:
    """Write `figure` as <stem>.png and <stem>.pdf atomically; return the paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in FORMATS:
        buffer = io.BytesIO()
        figure.savefig(buffer, format=fmt, dpi=150, bbox_inches="tight")
        path = stem.with_name(f"{stem.name}.{fmt}")
        write_atomic(path, buffer.getvalue())
        paths.append(path)
    return paths


def speed_quality(points_by_metric: dict[str, Sequence[Point]], title: str, stem: Path) -> list[Path]:
    """One panel per quality metric: quality (y) against speed-up (x), our points with their
    intervals as error bars; also <stem>.txt, every point in words (describe_points)."""
    metrics = [m for m, points in points_by_metric.items() if points]
    if not metrics:
        raise ValueError("no points with both a speed-up and a quality value to plot")
    figure = Figure(figsize=(4.6 * len(metrics), 3.8), layout="constrained")
    axes = figure.subplots(1, len(metrics), squeeze=False)[0]
    for axis, metric in zip(axes, metrics):
        _plot_points(axis, points_by_metric[metric])
        axis.set_xlabel("speed-up over raster AR (×)")
        axis.set_ylabel(QUALITY_LABELS.get(metric, metric))
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize="small", loc="best")
    figure.suptitle(title)
    paths = save(figure, stem)
    text = stem.with_name(f"{stem.name}.txt")
    write_atomic(text, describe_points({m: points_by_metric[m] for m in metrics}).encode("utf-8"))
    return [*paths, text]


def describe_points(points_by_metric: dict[str, Sequence[Point]]) -> str:
    """The speed-quality figure in words, one line per point: speed-up and quality, each with its
    95% interval where it has one ("LANTERN: speed-up 0.77 [0.44, 1.10], GenEval ↑ 76.7 [74.3, 79.1]")."""
    lines = [f"Bars: 95% intervals; speed-up: {SPEEDUP_INTERVAL}; quality: {QUALITY_INTERVAL}."]
    for metric, points in points_by_metric.items():
        for p in points:
            lines.append(f"{p.label}: speed-up {_with_interval(p.speedup, p.speedup_ci, 2)}, "
                         f"{QUALITY_LABELS.get(metric, metric)} {_with_interval(p.quality, p.quality_ci, 1)}")
    return "\n".join(lines) + "\n"


def _with_interval(value: float, interval: tuple[float, float] | None, decimals: int) -> str:
    """`value` followed by "[low, high]", or by "(no interval)" where the results give none (a
    GenEval with a tag of one image has no standard error; the paper's numbers have none)."""
    if interval is None:
        return f"{value:.{decimals}f} (no interval)"
    return f"{value:.{decimals}f} [{interval[0]:.{decimals}f}, {interval[1]:.{decimals}f}]"


def _plot_points(axis: object, points: Sequence[Point]) -> None:
    """Curves for series (sorted by τ, annotated); a marker per other method, hollow for the paper."""
    series = sorted({p.series for p in points if p.series is not None})
    for name in series:
        curve = sorted((p for p in points if p.series == name), key=lambda p: (p.tau is None, p.tau))
        line = axis.plot([p.speedup for p in curve], [p.quality for p in curve], "o-", label=name)[0]
        for p in curve:
            _error_bar(axis, p, line.get_color())
        for p in curve:
            if p.tau is not None:
                axis.annotate(f"τ={p.tau:g}", (p.speedup, p.quality), fontsize=7,
                              textcoords="offset points", xytext=(3, 3))
    methods = list(dict.fromkeys(_method(p) for p in points if p.series is None))
    for p in points:
        if p.series is None:
            at = methods.index(_method(p))
            color = f"C{(at + len(series)) % 10}"
            style = {"facecolors": "none", "edgecolors": color} if p.paper else {"color": color}
            axis.scatter([p.speedup], [p.quality], marker=_MARKERS[at % len(_MARKERS)], label=p.label,
                         zorder=3, **style)
            _error_bar(axis, p, color)


def _error_bar(axis: object, point: Point, color: str) -> None:
    """The point's confidence intervals as bars through it: the speed-up's horizontal, the
    quality's vertical (each where the point has one)."""
    if point.speedup_ci is None and point.quality_ci is None:
        return
    xerr = yerr = None
    if point.speedup_ci is not None:
        xerr = [[point.speedup - point.speedup_ci[0]], [point.speedup_ci[1] - point.speedup]]
    if point.quality_ci is not None:
        yerr = [[point.quality - point.quality_ci[0]], [point.quality_ci[1] - point.quality]]
    axis.errorbar([point.speedup], [point.quality], xerr=xerr, yerr=yerr, fmt="none",  # type: ignore[attr-defined]
                  ecolor=color, alpha=0.6, capsize=2)


def _method(point: Point) -> str:
    """The method a point belongs to: ours and the paper's share a marker and colour."""
    return point.label.removesuffix(PAPER_SUFFIX)


def rejection_heatmaps(maps: Sequence[tuple[str, np.ndarray]], title: str, stem: Path) -> list[Path]:
    """Mean rejections per position [rows, cols], one panel per (label, map), shared colour scale."""
    if not maps:
        raise ValueError("no rejection maps to plot")
    maps = list(maps)[:MAX_PANELS]
    top = max(float(m.max()) for _, m in maps) or 1.0
    columns = min(4, len(maps))
    rows = -(-len(maps) // columns)
    figure = Figure(figsize=(3.2 * columns, 3.0 * rows + 0.4), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False)
    image = None
    for axis, (label, grid) in zip(axes.flat, maps):
        image = axis.imshow(grid, cmap="magma", vmin=0.0, vmax=top, interpolation="nearest")
        axis.set_title(label, fontsize=9)
        axis.set_xticks([])
        axis.set_yticks([])
    for axis in list(axes.flat)[len(maps):]:
        axis.set_visible(False)
    figure.colorbar(image, ax=axes, shrink=0.8, label="mean rejections per image")
    figure.suptitle(title)
    return save(figure, stem)


def common_samples(panels: Sequence[Panel], count: int) -> pd.DataFrame:
    """Up to `count` sample ids present, with the same seed and prompt, in every panel's SampleSet,
    spread evenly over the shared ids (sorted); columns sample_id, prompt, seed."""
    shared: pd.DataFrame | None = None
    for panel in panels:
        records = panel.samples.records()[["sample_id", "prompt", "seed"]]
        shared = records if shared is None else shared.merge(records, on=["sample_id", "prompt", "seed"])
    if shared is None or shared.empty:
        return pd.DataFrame(columns=["sample_id", "prompt", "seed"])
    shared = shared.sort_values("sample_id").reset_index(drop=True)
    picks = np.unique(np.linspace(0, len(shared) - 1, num=min(count, len(shared))).round().astype(int))
    return shared.iloc[picks].reset_index(drop=True)


def image_grid(panels: Sequence[Panel], title: str, stem: Path, count: int = 6) -> list[Path]:
    """Methods as rows, the same prompts and seeds as columns (prompt text as column titles).

    Raises:
        ValueError: no panels, or no sample shared by all of them.
    """
    panels = list(panels)[:MAX_PANELS]
    if not panels:
        raise ValueError("no SampleSets to show")
    picks = common_samples(panels, count)
    if picks.empty:
        raise ValueError(f"the SampleSets {[p.label for p in panels]} share no sample (same id and seed)")
    figure = Figure(figsize=(1.9 * len(picks) + 1.2, 1.9 * len(panels) + 0.9), layout="constrained")
    axes = figure.subplots(len(panels), len(picks), squeeze=False)
    for r, panel in enumerate(panels):
        for c, pick in enumerate(picks.itertuples(index=False)):
            axis = axes[r, c]
            axis.imshow(panel.samples.load_image(pick.sample_id))
            axis.set_xticks([])
            axis.set_yticks([])
            if r == 0:
                axis.set_title(textwrap.shorten(str(pick.prompt), 60), fontsize=7, wrap=True)
            if c == 0:
                axis.set_ylabel(panel.label, fontsize=8)
    figure.suptitle(f"{title}: same sample ids and seeds in every row", fontsize=9)
    return save(figure, stem)


def samples_root(run_dir: Path | str) -> Path:
    """Folder of a run's per-decoder SampleSets: run.json's samples_dir, else <run_dir>/samples."""
    run_dir = Path(run_dir)
    try:
        config = json.loads((run_dir / "run.json").read_text()).get("config", {})
    except (OSError, ValueError):
        config = {}
    configured = config.get("samples_dir") if isinstance(config, dict) else None
    return Path(configured) if configured else run_dir / "samples"


def heatmap_of(samples: SampleSet) -> np.ndarray | None:
    """The mean rejection map of `samples`, or None when it has none (non-drafting decoders)."""
    if not samples.root.is_dir():
        return None
    try:
        return rejection_heatmap(samples)
    except ValueError as err:
        log.debug("%s: no heatmap (%s)", samples.root, err)
        return None


__all__ = ["Panel", "Point", "common_samples", "describe_points", "heatmap_of", "image_grid",
           "rejection_heatmaps", "samples_root", "save", "speed_quality"]
