"""Speed and acceptance statistics of a SampleSet, from its per-image stats (DESIGN.md §7).

Timing columns are written by the harness (harness/generate.py) once per batch and repeated on
each of its images (`batch_id`, `batch_size`, `batch_latency_s`, `condition_s`,
`peak_memory_bytes`; `timed`, `latency_reps_s`, `cpu_reps_s` or `device_reps_s` since timing got
repetitions; optionally `shard` and `warmup`); counters come from `DecodeStats.as_row()` and are
per image. Rows with `timed` false (decoded once, untimed) or `warmup` true count for the counters,
never for the timings.
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
NOISE_QUANTILE = 0.9  # timing_noise: this quantile of the per-batch noise over a decoder's timed batches
# MuLo-SD's per-image extras (baselines/framework/speculative.py, DecodeStats.extra): mean rows when present
EXTRA_MEANS = ("verify_forwards", "resample_forwards")


class _HasStats(Protocol):
    def stats(self) -> pd.DataFrame: ...


class SpeedEvaluator:
    """Latency, throughput, forward counts, step compression, acceptance and memory.

    Summary metrics (subset "all"; per image unless stated):
        latency_s, latency_p90_s: median and 90th percentile of the latency of the batch that made
            each image (warm-up batches excluded);
        throughput_img_s: images made by the distinct timed batches (their batch_size) / their
            summed latency, so images lost to a crash still count as work done (n = batches);
        condition_s: median text-conditioning time of each image's batch (what computing its
            conditions cost, charged alike to every decoder: harness/store/conditions.py);
        image_decode_s: median tokens-to-pixels time of each image's batch;
        end_to_end_s: median of condition + decode + tokens to pixels per image's batch (the
            paper's end-to-end latency; each part the median of the batch's repetitions);
        peak_memory_mb: largest per-batch peak memory (1 MB = 1e6 bytes; n = batches);
        target_forwards, drafter_forwards, resampled: means;
        step_compression: tokens / target forwards (ratio of sums);
        acceptance_rate: accepted / proposed over images that proposed drafts;
        accepted_per_step_mean, accepted_per_step_max: over all verification steps;
        timing_noise: the share of the timed decodes' time lost to other processes or to the thread
            being off the CPU (`timing_noise_of`; 0.9 quantile over batches): what the
            noisy-timing warning reads;
        timing_spread: median over timed batches of (max - min) / min of its repetitions' wall
            times: how repeatable one decode is on this machine (informational; the speed-up's
            interval already carries it);
        verify_forwards, resample_forwards (means), islands_per_step (islands / verify forwards),
            island_size (resampled positions per island), island_size_max: when the decoder
            records them (MuLo-SD's island-parallel resampler).
    Timings come from the timed rows only (`timed` not false, `warmup` not true); each batch's
    latency is the median of its repetitions (the harness writes it so).
    """

    def __init__(self, name: str = "speed", version: str = VERSION) -> None:
        self.name = name
        self.version = version

    def evaluate(self, samples: _HasStats) -> EvalResult:
        """Score `samples` (a harness.store.samples.SampleSet) from its stats table."""
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
    timed = _is_timed(stats)
    frame = pd.DataFrame({
        "sample_id": stats["sample_id"],
        "batch_id": stats["batch_id"].astype(str),
        "batch_size": stats["batch_size"] if "batch_size" in stats.columns else 1,
        "timed": timed,
        "latency_s": stats["batch_latency_s"].astype(float).where(timed),
        "latency_reps_s": stats["latency_reps_s"] if "latency_reps_s" in stats.columns else None,
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
    for name in (*EXTRA_MEANS, "islands", "resample_set", "island_size_max"):
        if name in stats.columns:
            frame[name] = stats[name].astype(float).fillna(0.0).to_numpy()
    target, proposed = frame["target_forwards"], frame["proposed"]
    frame["step_compression"] = frame["tokens"] / target.where(target > 0)
    frame["acceptance_rate"] = frame["accepted"] / proposed.where(proposed > 0)
    return frame


def _timing_rows(stats: pd.DataFrame) -> list[dict[str, Any]]:
    """Latency, throughput, conditioning time and peak memory rows."""
    rows: list[dict[str, Any]] = []
    timed = stats[_is_timed(stats)]
    if timed.empty:
        log.warning("no timed batch (every batch is a warm-up or untimed one); no latency or throughput "
                    "to report")
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
        if "image_decode_s" in timed.columns:
            pixels = timed["image_decode_s"].astype(float)
            rows.append(_row("image_decode_s", pixels.median(), math.nan, len(pixels), False))
            if "condition_s" in timed.columns:
                whole = timed["condition_s"].astype(float) + latency + pixels
                rows.append(_row("end_to_end_s", whole.median(), math.nan, len(whole), False))
        noise = _noise_per_batch(_batches(timed))
        if noise.notna().any():
            rows.append(_row("timing_noise", noise.quantile(NOISE_QUANTILE), math.nan, int(noise.notna().sum()),
                             False))
        spread = _spread_per_batch(_batches(timed))
        if spread.notna().any():
            rows.append(_row("timing_spread", spread.median(), math.nan, int(spread.notna().sum()), False))
    if "peak_memory_bytes" in stats.columns:
        # the timed batches' (the measured batch size); all batches when none is timed
        peaks = _batches(timed if not timed.empty else stats)["peak_memory_bytes"].astype(float) / BYTES_PER_MB
        rows.append(_row("peak_memory_mb", peaks.max(), math.nan, len(peaks), False))
    return rows


def _is_timed(stats: pd.DataFrame) -> pd.Series:
    """Per row: timed (not an untimed-pass row, not a warm-up row)."""
    timed = pd.Series(True, index=stats.index)
    if "timed" in stats.columns:
        timed &= stats["timed"].map(_truthy)
    if "warmup" in stats.columns:
        timed &= ~stats["warmup"].map(_truthy)
    return timed


def _truthy(value: Any) -> bool:
    """A boolean as written to a record (bool) or read back from CSV (text); missing is false."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    return str(value).strip().lower() in ("true", "1", "1.0")


def _floats(value: Any) -> list[float]:
    """A space-separated list of numbers (latency_reps_s, ...); [] when absent."""
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        return [float(value)] if math.isfinite(value) else []  # one repetition, read back from CSV
    if not isinstance(value, str) or not value.strip():
        return []
    return [float(v) for v in value.split()]


def timing_noise_of(latencies: list[float], cpu: list[float], device: list[float],
                    run: list[float] | None = None, wait: list[float] | None = None) -> float:
    """The noise of one timed batch: how much of its decodes' time was lost to something other than
    the decode itself. From its repetitions' decode wall times `latencies`, the decoding thread's
    CPU times `cpu` (CPU devices), CUDA-event times `device`, and the seconds the process's threads
    ran (`run`) and waited runnable for a CPU (`wait`, the kernel's schedstat). The largest of
        the contention, max over repetitions of wait / (run + wait): the share of the threads'
            runnable time another process took (about 0.006 on a quiet machine here, 0.3 and more
            beside one busy process);
        the steal, max over repetitions of 1 - cpu / wall: the share of a decode's wall time its
            thread did not run at all (kept off the CPU, blocked on a page fault, asleep);
        on CUDA, the spread of the event times, (max - min) / min: a GPU decode repeats to ~1%.
    The spread of the wall times is left out where the scheduler's times are known: on a quiet CPU
    two decodes of the same images differ by 10-20% (median; docs/methodology.md, "Timing noise")
    with no time lost to anything, and that spread is already in the speed-up's interval. Without
    the scheduler's times (another OS) it stands in for the contention. NaN when nothing is known."""
    parts = []
    if len(device) >= 2 and min(device) > 0:
        parts.append((max(device) - min(device)) / min(device))
    if run and wait and len(run) == len(wait):
        parts += [w / (r + w) for r, w in zip(run, wait) if r + w > 0]
    elif len(latencies) >= 2 and min(latencies) > 0:
        parts.append((max(latencies) - min(latencies)) / min(latencies))
    if cpu and len(cpu) == len(latencies):
        parts += [max(0.0, 1.0 - c / w) for c, w in zip(cpu, latencies) if w > 0]
    return max(parts) if parts else math.nan


def timing_spread_of(latencies: list[float]) -> float:
    """(max - min) / min of one batch's repetition wall times; NaN with fewer than two."""
    if len(latencies) < 2 or min(latencies) <= 0:
        return math.nan
    return (max(latencies) - min(latencies)) / min(latencies)


def _noise_per_batch(batches: pd.DataFrame) -> pd.Series:
    """timing_noise_of every batch (NaN for batches written before repetitions were recorded)."""
    def get(name: str) -> pd.Series:
        return batches[name] if name in batches.columns else pd.Series(None, index=batches.index, dtype=object)

    return pd.Series([timing_noise_of(_floats(lat), _floats(cpu), _floats(dev), _floats(run), _floats(wait))
                      for lat, cpu, dev, run, wait in zip(get("latency_reps_s"), get("cpu_reps_s"),
                                                          get("device_reps_s"), get("run_reps_s"),
                                                          get("wait_reps_s"))],
                     index=batches.index, dtype=float)


def _spread_per_batch(batches: pd.DataFrame) -> pd.Series:
    """timing_spread_of every batch."""
    reps = batches["latency_reps_s"] if "latency_reps_s" in batches.columns else pd.Series(None, index=batches.index)
    return pd.Series([timing_spread_of(_floats(lat)) for lat in reps], index=batches.index, dtype=float)


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
    for name in EXTRA_MEANS:
        if name in per_sample.columns:
            rows.append(_mean_row(name, per_sample[name], False))
    if "islands" in per_sample.columns and per_sample["islands"].sum() > 0:
        islands = per_sample["islands"]
        if "verify_forwards" in per_sample.columns and per_sample["verify_forwards"].sum() > 0:
            rows.append(_ratio_row("islands_per_step", islands, per_sample["verify_forwards"], False))
        if "resample_set" in per_sample.columns:
            rows.append(_ratio_row("island_size", per_sample["resample_set"], islands, False))
        if "island_size_max" in per_sample.columns:
            rows.append(_row("island_size_max", per_sample["island_size_max"].max(), math.nan, len(per_sample), False))
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
    columns = [c for c in ("batch_latency_s", "batch_size", "peak_memory_bytes", "latency_reps_s", "cpu_reps_s",
                           "device_reps_s", "run_reps_s", "wait_reps_s") if c in stats]
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
