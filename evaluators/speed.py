"""Speed and acceptance statistics of a SampleSet, from its per-image stats (DESIGN.md §7).

Timing columns are written by the harness once per batch and repeated on each of its images
(`batch_id`, `batch_size`, `batch_latency_s`, `condition_s`, `peak_memory_bytes`, optionally
`shard` and `warmup`); counters come from `DecodeStats.as_row()` and are per image.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Protocol

import numpy as np
import pandas as pd

from harness.api import EvalResult, int_list as _ints, metric_rows

log = logging.getLogger(__name__)

VERSION = "1"
REQUIRED_COLUMNS = ("batch_id", "batch_latency_s", "target_forwards", "tokens")
BYTES_PER_MB = 1e6


class _HasStats(Protocol):
    def stats(self) -> pd.DataFrame: ...


class SpeedEvaluator:
    """Latency, throughput, forward counts, step compression, acceptance and memory.

    Summary metrics (subset "all"; per image unless stated):
        latency_s, latency_p90_s: median and 90th percentile of the latency of the batch that made
            each image (warm-up batches excluded);
        throughput_img_s: images made by the distinct timed batches (their batch_size) / their
            summed latency, so images lost to a crash still count as work done (n = batches);
        condition_s: median text-conditioning time of each image's batch;
        peak_memory_mb: largest per-batch peak memory (1 MB = 1e6 bytes; n = batches);
        target_forwards, drafter_forwards, resampled: means;
        step_compression: tokens / target forwards (ratio of sums);
        acceptance_rate: accepted / proposed over images that proposed drafts;
        accepted_per_step_mean, accepted_per_step_max: over all verification steps.
    """

    def __init__(self, name: str = "speed", version: str = VERSION) -> None:
        self.name = name
        self.version = version

    def evaluate(self, samples: _HasStats) -> EvalResult:
        """Score `samples` (a harness.samples.SampleSet) from its stats table."""
        return speed_result(samples.stats())


def speed_result(stats: pd.DataFrame) -> EvalResult:
    """Compute the speed summary and per-sample table from a SampleSet's stats frame."""
    _validate(stats)
    stats = stats.reset_index(drop=True)
    per_sample = _per_sample(stats)
    rows = _timing_rows(stats) + _counter_rows(per_sample)
    return EvalResult(summary=metric_rows(rows), per_sample=per_sample)


def _validate(stats: pd.DataFrame) -> None:
    """Raise ValueError for an empty frame, missing columns or several decoders in one set."""
    if stats.empty:
        raise ValueError("the SampleSet has no complete samples; run the generate stage first")
    missing = [c for c in REQUIRED_COLUMNS if c not in stats.columns]
    if missing:
        raise ValueError(
            f"stats lack the columns {missing}; the harness writes them with every sample "
            "(batch timing plus DecodeStats.as_row())"
        )
    if "decoder" in stats.columns and stats["decoder"].nunique() > 1:
        raise ValueError(
            f"one SampleSet holds several decoders {sorted(stats['decoder'].unique())}; "
            "evaluate each decoder's SampleSet separately"
        )


def _per_sample(stats: pd.DataFrame) -> pd.DataFrame:
    """Per-image speed columns, keyed by sample_id."""
    step_lists = [_ints(v) for v in stats.get("accepted_per_step", [None] * len(stats))]
    frame = pd.DataFrame({
        "sample_id": stats["sample_id"],
        "latency_s": stats["batch_latency_s"].astype(float),
        "target_forwards": stats["target_forwards"].astype(float),
        "drafter_forwards": _column(stats, "drafter_forwards"),
        "tokens": stats["tokens"].astype(float),
        "proposed": _column(stats, "proposed"),
        "accepted": _column(stats, "accepted"),
        "resampled": _column(stats, "resampled"),
        "steps": [len(steps) for steps in step_lists],
        "accepted_in_steps": [sum(steps) for steps in step_lists],
        "accepted_per_step_max": [max(steps) if steps else np.nan for steps in step_lists],
    }).reset_index(drop=True)
    target, proposed = frame["target_forwards"], frame["proposed"]
    frame["step_compression"] = frame["tokens"] / target.where(target > 0)
    frame["acceptance_rate"] = frame["accepted"] / proposed.where(proposed > 0)
    return frame


def _timing_rows(stats: pd.DataFrame) -> list[dict[str, Any]]:
    """Latency, throughput, conditioning time and peak memory rows."""
    rows: list[dict[str, Any]] = []
    if "warmup" in stats.columns:
        timed = stats[~stats["warmup"].fillna(False).astype(bool)]
    else:
        timed = stats
    if timed.empty:
        log.warning("every batch is a warm-up batch; no latency or throughput to report")
    else:
        latency = timed["batch_latency_s"].astype(float)
        batches = _batches(timed)
        throughput = batches["batch_size"].sum() / batches["batch_latency_s"].sum()
        rows += [
            _row("latency_s", latency.median(), math.nan, len(latency), False),
            _row("latency_p90_s", latency.quantile(0.9), math.nan, len(latency), False),
            _row("throughput_img_s", throughput, math.nan, len(batches), True),
        ]
        if "condition_s" in timed.columns:
            condition = timed["condition_s"].astype(float)
            rows.append(_row("condition_s", condition.median(), math.nan, len(condition), False))
    if "peak_memory_bytes" in stats.columns:  # warm-up included: it is memory the run needed
        peaks = _batches(stats)["peak_memory_bytes"].astype(float) / BYTES_PER_MB
        rows.append(_row("peak_memory_mb", peaks.max(), math.nan, len(peaks), False))
    return rows


def _counter_rows(per_sample: pd.DataFrame) -> list[dict[str, Any]]:
    """Forward counts, step compression, acceptance and resampling rows (all images)."""
    rows = [
        _mean_row("target_forwards", per_sample["target_forwards"], False),
        _mean_row("drafter_forwards", per_sample["drafter_forwards"], False),
        _ratio_row("step_compression", per_sample["tokens"], per_sample["target_forwards"], True),
    ]
    proposing = per_sample[per_sample["proposed"] > 0]
    if not proposing.empty:
        accepted, proposed = proposing["accepted"], proposing["proposed"]
        rows.append(_ratio_row("acceptance_rate", accepted, proposed, True))
    stepped = per_sample[per_sample["steps"] > 0]
    if not stepped.empty:
        rows.append(_ratio_row(
            "accepted_per_step_mean", stepped["accepted_in_steps"], stepped["steps"], True
        ))
        top = stepped["accepted_per_step_max"].max()
        rows.append(_row("accepted_per_step_max", top, math.nan, len(stepped), True))
    rows.append(_mean_row("resampled", per_sample["resampled"], False))
    return rows


def _batches(stats: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct batch (keyed by shard and batch_id) with its batch-level columns."""
    keys = [c for c in ("shard", "batch_id") if c in stats.columns]
    grouped = stats.groupby(keys, sort=False, dropna=False)
    clashing = grouped["batch_latency_s"].nunique(dropna=False)
    if (clashing > 1).any():
        raise ValueError(
            f"batch ids {list(clashing[clashing > 1].index[:5])} carry several latencies: batch_id "
            "must be unique within a SampleSet (add a `shard` stats column or prefix the shard)"
        )
    columns = [c for c in ("batch_latency_s", "batch_size", "peak_memory_bytes") if c in stats]
    batches = grouped[columns].first()
    if "batch_size" not in batches.columns:
        batches["batch_size"] = grouped.size()
    return batches


def _column(stats: pd.DataFrame, name: str) -> pd.Series:
    """Numeric column `name`, zeros when a decoder does not write it."""
    if name not in stats.columns:
        return pd.Series(0.0, index=stats.index)
    return stats[name].astype(float).fillna(0.0)


def _row(metric: str, value: float, stderr: float, n: int, higher_is_better: bool) -> dict:
    """One summary row (subset "all")."""
    return {"metric": metric, "value": float(value), "stderr": float(stderr), "n": int(n),
            "higher_is_better": higher_is_better}


def _mean_row(metric: str, values: pd.Series, higher_is_better: bool) -> dict[str, Any]:
    """Mean with its standard error (NaN for a single value)."""
    values = values.astype(float)
    n = len(values)
    stderr = values.std(ddof=1) / math.sqrt(n) if n > 1 else math.nan
    return _row(metric, values.mean(), stderr, n, higher_is_better)


def _ratio_row(metric: str, num: pd.Series, den: pd.Series, higher_is_better: bool) -> dict:
    """Ratio of sums sum(num) / sum(den) with its delta-method standard error over images."""
    num, den = num.astype(float).to_numpy(), den.astype(float).to_numpy()
    n = len(num)
    ratio = num.sum() / den.sum() if den.sum() > 0 else math.nan
    # Var(R) ~= Var(num - R den) / (n mean(den)^2), the usual ratio-estimator linearisation.
    if n > 1 and den.sum() > 0:
        residual = num - ratio * den
        stderr = math.sqrt((residual**2).sum() / ((n - 1) * n)) / den.mean()
    else:
        stderr = math.nan
    return _row(metric, ratio, stderr, n, higher_is_better)
