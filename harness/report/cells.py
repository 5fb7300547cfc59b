"""From the merged summary rows (`harness.store.summary.load`) to one value per table cell.

A cell is keyed by (model, decoder, swept keys..., metric key). When several runs give the same
cell, the run whose directory sorts last wins (run directories are timestamped, so the newest) and a
warning names the others; two evaluators of one run giving the same metric is an error.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from harness.api import INTERVAL_COLUMNS, METRIC_COLUMNS, SETTING_COLUMN
from harness.report.specs import MetricSpec

log = logging.getLogger(__name__)

RUN_COLUMNS = ("experiment", "model", "decoder", "dataset", "evaluator", "evaluator_version")
SPEEDUP_METRIC = "speedup_vs_raster"
DERIVED_FROM = "speedup_raster_run"  # column of derived speed-up rows: the raster run they divide
NOT_SWEPT = frozenset({*RUN_COLUMNS, *METRIC_COLUMNS, *INTERVAL_COLUMNS, "run_dir", DERIVED_FROM})
VARYING_ONLY = frozenset({"engine"})  # run columns shown only when they differ between rows
# SETTING (a decoder's setting where it differs from the paper's, harness/comparisons.decoder_setting) is a row key like a
# swept key, shown in the method's label rather than as a column of its own.
SETTING = SETTING_COLUMN
ROW_KEYS = ("model", "decoder")
CELL_COLUMNS = ("key", "value", "stderr", *INTERVAL_COLUMNS, "n", "run_dir", DERIVED_FROM)


def swept_columns(frame: pd.DataFrame) -> list[str]:
    """The swept-key columns of `frame` that hold a value in at least one row (frame order); the
    `engine` run column counts only where runs of both engines meet in one frame."""
    return [c for c in frame.columns if c not in NOT_SWEPT and frame[c].notna().any()
            and (c not in VARYING_ONLY or frame[c].nunique() > 1)]


def with_derived_speedup(frame: pd.DataFrame) -> pd.DataFrame:
    """Add `speedup_vs_raster` where a run timed a decoder but ran no raster decoder itself.

    The reference is the newest raster `latency_s` of the same experiment, model and dataset (e.g. a
    tau sweep whose jobs run only mulo_sd next to one raster job). Derived rows name that raster run
    in the DERIVED_FROM column when it is another run; runs with their own speed-up row are left alone.
    """
    if frame.empty or "metric" not in frame.columns:
        return frame
    scope = [c for c in ("experiment", "model", "dataset") if c in frame.columns]
    latency = frame[(frame["metric"] == "latency_s") & (frame["subset"] == "all")]
    measured = frame[frame["metric"] == SPEEDUP_METRIC]
    own = set(zip(measured["run_dir"], measured["decoder"]))
    references: dict[tuple, tuple[float, str]] = {}
    for _, row in latency[latency["decoder"] == "raster"].sort_values("run_dir").iterrows():
        references[_key(row, scope)] = (float(row["value"]), str(row["run_dir"]))  # newest wins
    derived = []
    for _, row in latency.iterrows():
        reference = references.get(_key(row, scope))
        if (row["run_dir"], row["decoder"]) in own or reference is None or not float(row["value"]) > 0:
            continue
        derived.append({**row.to_dict(), "metric": SPEEDUP_METRIC, "value": reference[0] / float(row["value"]),
                        "stderr": math.nan, "higher_is_better": True,
                        DERIVED_FROM: None if reference[1] == row["run_dir"] else reference[1]})
    if not derived:
        return frame
    log.info("derived speed-up for %d (run, decoder) pairs from a raster run of the same experiment",
             len(derived))
    return pd.concat([frame, pd.DataFrame(derived)], ignore_index=True)


def select_cells(frame: pd.DataFrame, experiments: Sequence[str],
                 metrics: Sequence[MetricSpec]) -> tuple[pd.DataFrame, list[str]]:
    """Return (cells, swept) for the rows of `experiments`.

    cells: one row per (model, decoder, *swept, key) with the value, stderr and confidence interval
        (ci_low, ci_high; NaN where the results have none) in the shown unit (times
        MetricSpec.scale), n, run_dir and DERIVED_FROM; swept values are NaN where unset.
    swept: the swept-key columns used by these experiments.

    Raises:
        ValueError: one run reports a metric twice for the same cell (e.g. two FID evaluators).
    """
    rows = frame[frame["experiment"].isin(experiments)] if "experiment" in frame.columns else frame.iloc[:0]
    swept = swept_columns(rows)
    keys = [*ROW_KEYS, *swept]
    parts = []
    for spec in metrics:
        chosen = rows[(rows["metric"] == spec.metric) & (rows["subset"].astype(str) == spec.subset)]
        if spec.dataset is not None:
            chosen = chosen[chosen["dataset"].astype(str) == spec.dataset] if "dataset" in chosen else chosen.iloc[:0]
        if chosen.empty:
            continue
        chosen = _newest(chosen, keys, spec.metric)
        parts.append(pd.DataFrame({
            **{k: chosen[k].to_numpy() for k in keys},
            "key": spec.key,
            "value": pd.to_numeric(chosen["value"], errors="coerce").to_numpy() * spec.scale,
            "stderr": pd.to_numeric(chosen["stderr"], errors="coerce").to_numpy() * spec.scale,
            **{c: (pd.to_numeric(chosen[c], errors="coerce").to_numpy() * spec.scale if c in chosen
                   else np.full(len(chosen), np.nan)) for c in INTERVAL_COLUMNS},
            "n": chosen["n"].to_numpy(),
            "run_dir": chosen["run_dir"].to_numpy(),
            DERIVED_FROM: chosen[DERIVED_FROM].to_numpy() if DERIVED_FROM in chosen else None,
        }))
    if not parts:
        return pd.DataFrame(columns=[*keys, *CELL_COLUMNS]), swept
    return pd.concat(parts, ignore_index=True), swept


def _newest(rows: pd.DataFrame, keys: list[str], metric: str) -> pd.DataFrame:
    """One row per `keys`: the one from the run directory that sorts last."""
    rows = rows.assign(_order=range(len(rows))).sort_values(["run_dir", "_order"], kind="stable")
    filled = rows[keys].astype(object).where(rows[keys].notna(), "\0")
    same_run = rows[filled.assign(run_dir=rows["run_dir"]).duplicated(keep=False)]
    if not same_run.empty:
        first = same_run.iloc[0]
        evaluators = sorted(set(same_run.get("evaluator", pd.Series(["?"])).astype(str)))
        raise ValueError(
            f"run {first['run_dir']} reports {metric!r} more than once for "
            f"{ {k: first[k] for k in keys} } (evaluators {evaluators}); keep one evaluator per "
            "metric in a run, or load only the runs to compare")
    duplicated = filled.duplicated(keep="last")
    for _, row in rows[duplicated].iterrows():
        log.warning("%s of %s: the newer run replaces %s", metric,
                    {k: row[k] for k in keys if pd.notna(row[k])}, row["run_dir"])
    return rows[~duplicated].sort_values("_order").drop(columns="_order")


def _key(row: pd.Series, columns: list[str]) -> tuple[Any, ...]:
    """The values of `columns` in `row`, NaN as None (hashable and equal to itself)."""
    return tuple(None if pd.isna(row[c]) else row[c] for c in columns)


__all__ = ["DERIVED_FROM", "SETTING", "SPEEDUP_METRIC", "select_cells", "swept_columns", "with_derived_speedup"]
