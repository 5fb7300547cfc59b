"""How each decoder compares with raster run in the same job: the rows a job adds after its evaluators.

`speedup_vs_raster`: raster's latency over the decoder's, per timed image (a median over its
repetitions), with a paired bootstrap confidence interval (`stderr`, `ci_low`, `ci_high`).
`geneval_gap_vs_raster`: the paired difference of per-image GenEval verdicts, with its standard
error. `warn_noisy_timing` names the decoders whose `timing_noise` exceeds the threshold.
`decoder_setting` says how a decoder's setting differs from the paper's (a row run at a world's
operating point is labelled with it).
"""
from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from harness.api import INTERVAL_COLUMNS
from harness.store.binding import ABSENT, dotted, leaves, signature_defaults
from harness.store.summary import paired_difference

log = logging.getLogger(__name__)

BOOTSTRAP_DRAWS = 2000  # resamples of the speed-up's confidence interval
CI_LEVEL = 0.95


def with_comparisons(summary: pd.DataFrame, verdicts: dict[tuple[str, str], pd.DataFrame]) -> pd.DataFrame:
    """`summary` (the evaluators' rows of a job, with run columns) plus the rows that compare each
    decoder with raster: speedup_vs_raster (with its interval) and geneval_gap_vs_raster.
    `verdicts`: per-image tables by (decoder, evaluator name)."""
    return _with_geneval_gap(_with_speedup(summary, verdicts), verdicts)


def _with_speedup(summary: pd.DataFrame, verdicts: dict[tuple[str, str], pd.DataFrame]) -> pd.DataFrame:
    """Add `speedup_vs_raster` (raster's median latency / the decoder's) when raster is in the job:
    the side-by-side ratio the paper reports, with its bootstrap standard error and confidence
    interval (`speedup_interval`) where the speed evaluator's per-image latencies are at hand."""
    lat = summary[(summary.metric == "latency_s") & (summary.subset == "all")]
    base = lat[lat.decoder == "raster"]
    if base.empty:
        return summary
    ref = float(base.value.iloc[0])
    rows = lat.copy()
    rows["metric"] = "speedup_vs_raster"
    rows["value"] = ref / rows["value"].astype(float)
    rows["higher_is_better"] = True
    intervals = []
    reference = verdicts.get(("raster", str(base.evaluator.iloc[0])))
    for _, row in rows.iterrows():
        mine = verdicts.get((row.decoder, row.evaluator))
        if mine is None or reference is None:
            intervals.append((math.nan, math.nan, math.nan))
        else:
            intervals.append(speedup_interval(mine, reference)[1:])
    rows["stderr"] = [i[0] for i in intervals]
    rows[list(INTERVAL_COLUMNS)] = [list(i[1:]) for i in intervals]
    ratios = [_ratio_rows(summary, "end_to_end_s", "speedup_e2e_vs_raster"),
              _ratio_rows(summary, "target_forwards", "forward_compression_vs_raster")]
    return pd.concat([summary, rows, *ratios], ignore_index=True)


def _ratio_rows(summary: pd.DataFrame, metric: str, name: str) -> pd.DataFrame:
    """Rows `name` = raster's `metric` / each decoder's, when raster is in the job: with `end_to_end_s`
    the paper's end-to-end speed-up (condition + decode + tokens to pixels), with `target_forwards`
    the forward-count compression (machine-independent)."""
    found = summary[(summary.metric == metric) & (summary.subset == "all")]
    base = found[found.decoder == "raster"]
    if base.empty:
        return found.iloc[0:0]
    rows = found.copy()
    rows["metric"] = name
    rows["value"] = float(base.value.iloc[0]) / rows["value"].astype(float)
    rows["stderr"] = math.nan
    rows["higher_is_better"] = True
    return rows


def _units(per_sample: pd.DataFrame) -> tuple[list[str], list[np.ndarray], np.ndarray]:
    """The timed batches of a speed per_sample table: (key, repetition latencies, images) per batch.
    The key is the batch's sorted sample ids, so two decoders' batches of the same images pair."""
    frame = per_sample
    if "timed" in frame.columns:
        frame = frame[frame["timed"].astype(str).str.lower().isin(("true", "1", "1.0"))]
    frame = frame[pd.to_numeric(frame["latency_s"], errors="coerce").notna()]
    keys, reps, sizes = [], [], []
    group = frame["batch_id"] if "batch_id" in frame.columns else frame["sample_id"]
    for _, batch in frame.groupby(group, sort=False):
        listed = batch["latency_reps_s"].iloc[0] if "latency_reps_s" in batch.columns else None
        values = [float(v) for v in str(listed).split()] if isinstance(listed, (str, float, int)) else []
        values = [v for v in values if math.isfinite(v)]
        keys.append(" ".join(sorted(batch["sample_id"].astype(str))))
        reps.append(np.asarray(values or [float(batch["latency_s"].iloc[0])], dtype=float))
        sizes.append(len(batch))
    return keys, reps, np.asarray(sizes, dtype=float)


def speedup_interval(mine: pd.DataFrame, reference: pd.DataFrame, draws: int = BOOTSTRAP_DRAWS,
                     level: float = CI_LEVEL, seed: int = 0) -> tuple[float, float, float, float]:
    """Speed-up of `mine` over `reference` (speed per_sample tables: sample_id, batch_id, latency_s,
    latency_reps_s, timed) as (point, stderr, ci_low, ci_high).

    point: the reference's median per-image latency / mine (latency = median of the repetitions).
    The interval is a two-level bootstrap: timed batches are resampled with replacement (the same
    draw for both decoders when their batches hold the same images: a paired ratio), then each
    batch's repetitions, and the ratio of the per-image medians is taken; ci_low / ci_high are its
    (1 - level) / 2 and (1 + level) / 2 quantiles, stderr its standard deviation. Seeded: the same
    latencies give the same interval. NaN where either side has fewer than two timed decodes.
    """
    mine_keys, mine_reps, mine_sizes = _units(mine)
    ref_keys, ref_reps, ref_sizes = _units(reference)
    if not mine_keys or not ref_keys:
        return (math.nan,) * 4
    if min(sum(len(r) for r in mine_reps), sum(len(r) for r in ref_reps)) < 2:
        return (math.nan,) * 4  # one decode on a side: nothing to resample
    point = _weighted_median(np.array([[np.median(r) for r in ref_reps]]), ref_sizes)[0] \
        / _weighted_median(np.array([[np.median(r) for r in mine_reps]]), mine_sizes)[0]
    rng = np.random.default_rng(seed)
    pick_ref = rng.integers(0, len(ref_keys), size=(draws, len(ref_keys)))
    ref_idx = [rng.integers(0, len(r), size=(draws, len(r))) for r in ref_reps]
    if sorted(mine_keys) == sorted(ref_keys):  # paired: the same images, and the same repetitions
        where = {k: i for i, k in enumerate(ref_keys)}
        to_ref = np.array([where[k] for k in mine_keys])  # mine's batch j holds ref's batch to_ref[j]
        pick_mine = np.argsort(to_ref)[pick_ref]
        mine_idx = [ref_idx[to_ref[j]] if len(r) == len(ref_reps[to_ref[j]])
                    else rng.integers(0, len(r), size=(draws, len(r))) for j, r in enumerate(mine_reps)]
    else:
        pick_mine = rng.integers(0, len(mine_keys), size=(draws, len(mine_keys)))
        mine_idx = [rng.integers(0, len(r), size=(draws, len(r))) for r in mine_reps]
    rows = np.arange(draws)[:, None]
    ratios = _weighted_median(_resampled(ref_reps, ref_idx)[rows, pick_ref], ref_sizes[pick_ref]) \
        / _weighted_median(_resampled(mine_reps, mine_idx)[rows, pick_mine], mine_sizes[pick_mine])
    low, high = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(point), float(np.std(ratios, ddof=1)) if draws > 1 else math.nan, float(low), float(high)


def _resampled(reps: list[np.ndarray], idx: list[np.ndarray]) -> np.ndarray:
    """[draws, batches]: per draw and batch, the median of the batch's repetitions drawn at `idx`
    (per batch [draws, repetitions] indices: resampling with replacement)."""
    return np.stack([np.median(values[i], axis=1) for values, i in zip(reps, idx)], axis=1)


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Row-wise median of `values` [D, U] with integer weights [D, U] (or [U]): each value counted
    `weight` times; the mean of the two middle values when the total weight is even (pandas's
    median of per-image rows)."""
    weights = np.broadcast_to(weights, values.shape)
    order = np.argsort(values, axis=1)
    v = np.take_along_axis(values, order, axis=1)
    cum = np.cumsum(np.take_along_axis(weights, order, axis=1), axis=1)
    total = cum[:, -1:]
    lower = np.argmax(cum >= (total + 1) // 2, axis=1)  # the image at position ceil(total / 2)
    upper = np.argmax(cum >= total // 2 + 1, axis=1)  # the image at position total // 2 + 1
    rows = np.arange(len(values))
    return (v[rows, lower] + v[rows, upper]) / 2


def warn_noisy_timing(summary: pd.DataFrame, threshold: float) -> list[str]:
    """Log a warning naming every decoder whose `timing_noise` exceeds `threshold`; return them."""
    if summary.empty or "metric" not in summary.columns:
        return []
    noise = summary[(summary.metric == "timing_noise") & (summary.subset == "all")]
    noisy = noise[pd.to_numeric(noise.value, errors="coerce") > threshold]
    if noisy.empty:
        return []
    names = [str(d) for d in noisy.decoder]
    figures = ", ".join(f"{d} {float(v):.2f}" for d, v in zip(noisy.decoder, noisy.value))
    log.warning("timing unreliable for %s: timing_noise (%s) above timing.noise_threshold %.2f. That share "
                "of the timed decodes' time went to other processes holding the CPU, or the decoding thread "
                "was off the CPU; do not trust these decoders' latencies and speed-ups. Rerun on a quiet "
                "machine (docs/methodology.md, 'Noise').", ", ".join(names), figures, threshold)
    return names


def _with_geneval_gap(summary: pd.DataFrame, verdicts: dict[tuple[str, str], pd.DataFrame]) -> pd.DataFrame:
    """Add `geneval_gap_vs_raster` (GenEval overall minus raster's on the same images, `stderr` the
    paired standard error; evaluators/geneval_rules.paired_difference) for every decoder whose
    `geneval` score has per-image verdicts, when raster is in the same job."""
    overall = summary[(summary.metric == "geneval") & (summary.subset == "all")]
    rows = []
    for _, row in overall.iterrows():
        mine, reference = verdicts.get((row.decoder, row.evaluator)), verdicts.get(("raster", row.evaluator))
        if mine is None or reference is None:
            continue
        gap, stderr = paired_difference(mine, reference)
        rows.append({**row.to_dict(), "metric": "geneval_gap_vs_raster", "value": gap, "stderr": stderr,
                     "higher_is_better": True})
    return pd.concat([summary, pd.DataFrame(rows)], ignore_index=True) if rows else summary


def decoder_setting(cfg: DictConfig, decoder: str, bound: dict[str, Any] | None = None) -> str | None:
    """The decoder's setting, e.g. "k=32, δ=0.4, on_reject=pooled", where it differs from the paper's;
    None at the paper's setting or for a decoder whose config declares none (`paper_setting`: the
    paper's values of the keys a world's operating point may move). Read from the binding of the
    images scored (`bound`: a stored set made under another setting is labelled with its own), else
    from this job's config; a key the binding predates has its target's default
    (harness/store/binding.py)."""
    node = (cfg.get("decoder") or {}).get(decoder)
    paper = node.get("paper_setting") if node is not None else None
    if not paper:
        return None
    stored = (bound or {}).get("decoder")
    used = stored if isinstance(stored, dict) else OmegaConf.to_container(node, resolve=True)
    paper_values = leaves(OmegaConf.to_container(paper, resolve=True))
    pairs = [(key, value, _value_at(used, key)) for key, value in paper_values.items()]
    if all(_json_equal(value, now) for _, value, now in pairs):
        return None
    from harness.report.specs import swept_label  # plain labels (no plotting library)

    return ", ".join(f"{swept_label(key)}={_plain(now)}" for key, _, now in pairs)


def model_setting(cfg: DictConfig) -> str | None:
    """The model's setting where it runs otherwise than its published protocol: "key=value" of every
    `model.paper_precision` key (e.g. Tar: AR-DTok and TA-Tok in fp32, the LLM in bf16, as its eval
    scripts) whose value in `model` differs, joined by ", " (e.g. "dtype=bf16"); None where all match or
    the model declares no published precision."""
    model = cfg.get("model")
    paper = model.get("paper_precision") if model is not None else None
    if not paper:
        return None
    changed = []
    for key, value in OmegaConf.to_container(paper, resolve=True).items():
        now = OmegaConf.select(model, str(key))
        if str(now) != str(value):
            changed.append(f"{key}={now}")
    return ", ".join(changed) or None


def joined(*settings: str | None) -> str | None:
    """The non-empty settings joined by ", " (None if none)."""
    parts = [s for s in settings if s]
    return ", ".join(parts) or None


def _value_at(node: dict[str, Any], key: str) -> Any:
    """The value at dotted `key` of a decoder node; one its binding predates reads as the default of
    its parent node's `_target_`."""
    value = dotted(node, key)
    if value is not ABSENT:
        return value
    parent, _, name = key.rpartition(".")
    target = dotted(node, f"{parent}._target_" if parent else "_target_")
    return signature_defaults(target).get(name) if isinstance(target, str) else None


def _json_equal(a: Any, b: Any) -> bool:
    """Equal as config values (1000 == 1000.0; a string only equals the same string)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def _plain(value: Any) -> str:
    """A setting value as shown: numbers without trailing zeros."""
    return f"{value:g}" if isinstance(value, float) else str(value)
