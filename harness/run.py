"""The pipeline of one job: prompts -> condition -> decode (timed: harness/generate.py) -> images ->
SampleSet -> evaluators -> summary.csv + run.json + a printed table.

Every decoder of the job is built and its SampleSet bound before the generate stage, which times
them all together (interleaved, repeated: harness.generate.generate_all). After the evaluators, the
job adds the rows that compare decoders with raster: `speedup_vs_raster` with a bootstrap
confidence interval (`stderr`, `ci_low`, `ci_high`; `speedup_interval`) and `geneval_gap_vs_raster`
with its paired standard error, and warns about decoders whose `timing_noise` exceeds
`timing.noise_threshold`."""
from __future__ import annotations

import logging
import math
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from harness import engine, preflight, provenance, results
from harness.results import paired_difference
from harness.api import (INTERVAL_COLUMNS, SETTING_COLUMN, ConfigValueError, Decoder, Evaluator, InputError,
                         ModelBundle, SamplingParams, checked_number)
from harness.binding import signature_defaults, without_defaults
from harness.datasets.prompts import select
from harness.generate import Job, Timing, generate_all
from harness.models.guidance import Guided
from harness.samples import NotWritableError, SampleSet, binding_differences, plan, write_atomic

log = logging.getLogger(__name__)

RUN_KEYS = ("experiment", "model", "decoder", "dataset")
STAGES = ("fetch", "generate", "evaluate")
BINDING_FORMAT = 1
BOOTSTRAP_DRAWS = 2000  # resamples of the speed-up's confidence interval
CI_LEVEL = 0.95
# Model config keys that say where or how weights are loaded, not which weights: left out of a
# SampleSet's binding (the weights themselves are bound by their digest).
_LOCATION_KEYS = frozenset({"sampling", "device", "cache_dir", "local_dir", "local_path", "trust_pickle", "name"})
# Model keys that configure decoders, not the model: a decoder's operating point on this world reaches
# the binding through the decoder's own keys, so the model's binding leaves it out.
_DECODER_KEYS = frozenset({"operating_points"})
# Informational keys of config nodes: never passed to the target (`requires`, `provides`: read by
# harness/preflight.py; `paper_setting`: the paper's values of the keys a world may move) nor bound.
_INFO_KEYS = ("requires", "provides", "paper_setting")


class EvaluationFailedError(RuntimeError):
    """One or more evaluators failed; the rows of the others were written."""


def _build(node: DictConfig, drop: tuple[str, ...] = ("name",)) -> Any:
    """Instantiate a config node without its informational keys (`name`; a model's `sampling`
    holds its recommended sampling defaults, which `conf/config.yaml` reads, and its
    `operating_points` the decoders' settings on its world; `requires` and `provides` are read by
    harness/preflight.py; a decoder's `paper_setting` labels rows run otherwise)."""
    conf = OmegaConf.to_container(node, resolve=True)
    assert isinstance(conf, dict)
    for key in (*drop, *_INFO_KEYS, *_DECODER_KEYS):
        conf.pop(key, None)
    return instantiate(conf)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigValueError(f"device={name} requested but CUDA is not available; use device=cpu or device=auto")
    return torch.device(name)


def guided(bundle: ModelBundle, sampling: SamplingParams) -> ModelBundle:
    """Wrap every model of the bundle in classifier-free guidance unless the scale is 1."""
    if sampling.cfg_scale == 1.0:
        return bundle
    wrap = lambda m: None if m is None else Guided(m, sampling.cfg_scale)  # noqa: E731
    return ModelBundle(name=bundle.name, target=wrap(bundle.target), conditioner=bundle.conditioner,
                       drafter=wrap(bundle.drafter), small_drafter=wrap(bundle.small_drafter),
                       weights_id=bundle.weights_id)


def _decoders(cfg: DictConfig) -> dict[str, DictConfig]:
    chosen = cfg.get("decoder")
    if not chosen:
        raise ConfigValueError("no decoder selected: choose one or more, e.g. decoder=[raster] "
                               "(the options are the files in conf/decoder/)")
    return {str(k): v for k, v in chosen.items()}


def _evaluators(cfg: DictConfig, names: list[str]) -> list[Evaluator]:
    """The evaluators `names` (those the preflight plan keeps), instantiated."""
    return [_build(node, drop=()) for name, node in (cfg.get("evaluator") or {}).items() if name in names]


def _timing(cfg: DictConfig) -> Timing:
    """The `timing` node as a Timing (defaults where the config has no such node)."""
    node = cfg.get("timing")
    return Timing.from_config(OmegaConf.to_container(node, resolve=True) if node is not None else {})


def check_config(cfg: DictConfig) -> None:
    """Refuse run-level config values of the wrong type or range, naming the key and the fix."""
    if not isinstance(cfg.get("name"), str) or not cfg.name:
        raise ConfigValueError(f"name must be a non-empty string, got {cfg.get('name')!r}")
    checked_number("seed", cfg.seed, integer=True)
    for key, low in (("batch_size", 1), ("images_per_prompt", 1), ("warmup_batches", 0),
                     ("shard.index", 0), ("shard.count", 1)):
        checked_number(key, OmegaConf.select(cfg, key), integer=True, low=low)
    if cfg.shard.index >= cfg.shard.count:
        raise ConfigValueError(f"shard.index ({cfg.shard.index}) must be below shard.count ({cfg.shard.count}); "
                               "shards are numbered 0 .. count-1")
    for key in ("threads", "dataset_limit"):
        if cfg.get(key) is not None:
            checked_number(key, cfg.get(key), integer=True, low=1)
    checked_number("dataset_start", cfg.get("dataset_start") or 0, integer=True, low=0)
    _timing(cfg)
    if cfg.get("engine", "eager") not in engine.ENGINES:
        raise ConfigValueError(f"engine must be one of {engine.ENGINES}, got {cfg.get('engine')!r}")
    if not isinstance(cfg.device, str):
        raise ConfigValueError(f"device must be auto, cpu, cuda or cuda:N, got {cfg.device!r}")
    stages = list(cfg.get("stages") or [])
    unknown = [s for s in stages if s not in STAGES]
    if not stages or unknown or len(set(stages)) != len(stages):
        problem = f"unknown stage(s) {unknown}" if unknown else "an empty list" if not stages else "repeats"
        raise ConfigValueError(f"stages must be a non-empty list of distinct names from {list(STAGES)}, "
                               f"got {stages} ({problem}); e.g. stages=[generate,evaluate]")
    _build(cfg.sampling, drop=())  # SamplingParams checks its own fields
    if not isinstance(cfg.get("overwrite_samples", False), bool):
        raise ConfigValueError(f"overwrite_samples must be true or false, got {cfg.overwrite_samples!r}")
    samples_dir = cfg.get("samples_dir")
    if samples_dir is not None and (not isinstance(samples_dir, str) or Path(samples_dir).is_file()):
        raise ConfigValueError(f"samples_dir {samples_dir!r} is not a folder; point it at a folder "
                               "of per-decoder SampleSets (or null: <run dir>/samples)")


def run(cfg: DictConfig, out_dir: Path) -> pd.DataFrame:
    """Run the configured stages; return the long summary table of this job.

    Raises:
        EvaluationFailedError: an evaluator failed; the other evaluators' rows were written.
    """
    check_config(cfg)
    _writable(out_dir, "results directory (hydra.run.dir)")
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    device = _device(cfg.device)
    if "generate" in cfg.stages:  # scoring stored samples compiles nothing
        engine.check(str(cfg.get("engine") or "eager"), device)
    jobs_plan = preflight.check(cfg)  # incompatible decoders / evaluators, missing weights: before anything
    decoders = {n: node for n, node in _decoders(cfg).items() if n in jobs_plan.decoders}
    if not decoders:
        raise preflight.IncompatibleError(f"no decoder left to run on model {cfg.model.get('name')}: "
                                          f"{jobs_plan.skipped}")
    timing = _timing(cfg)
    if "fetch" in cfg.stages:
        preflight.fetch(cfg)
        if list(cfg.stages) == ["fetch"]:
            return pd.DataFrame()
    start = int(cfg.get("dataset_start") or 0)
    prompts = select(_build(cfg.dataset)[start:], cfg.dataset_limit)
    if not prompts:
        raise ConfigValueError(f"dataset {cfg.dataset.get('name', '')!r} holds no prompt; check dataset.n, "
                               "dataset.path, dataset_start or dataset_limit")
    specs = plan(prompts, cfg.images_per_prompt, cfg.seed, shard=cfg.shard.index, num_shards=cfg.shard.count)
    full_plan = plan(prompts, cfg.images_per_prompt, cfg.seed)  # what an evaluate stage scores
    _check_shard_stages(cfg)
    evaluators = _evaluators(cfg, jobs_plan.evaluators) if "evaluate" in cfg.stages else []  # fail now
    samples_root = Path(cfg.samples_dir) if cfg.samples_dir else out_dir / "samples"
    if "generate" in cfg.stages:
        _writable(samples_root, "samples directory (samples_dir)")
    log.info("%s", preflight.describe(cfg, jobs_plan, len(prompts), len(full_plan)))
    extra: dict[str, Any] = {"seed": cfg.seed, "prompts": len(prompts), "samples": len(specs),
                             "plan": preflight.to_dict(jobs_plan)}
    provenance.write_run_json(out_dir / "run.json", OmegaConf.to_container(cfg, resolve=True), extra)
    sample_sets = {name: SampleSet(samples_root / name) for name in decoders}
    if "generate" in cfg.stages:
        bundle = _build(cfg.model, drop=("name", "sampling"))
        weights = _weights_id(bundle)
        bundle = bundle.to(device)
        engine.apply(bundle, str(cfg.get("engine") or "eager"), device)
        bundle.name = str(cfg.model.get("name", bundle.name))
        jobs = []
        for name, dec_cfg in decoders.items():  # every set bound before anything is generated
            decoder: Decoder = _build(dec_cfg)
            sample_sets[name].bind(sample_binding(cfg, name, weights, device),
                                   overwrite=bool(cfg.get("overwrite_samples", False)),
                                   compared=without_defaults)  # options at their defaults left out
            models = guided(bundle, decoder.sampling)  # type: ignore[attr-defined]
            jobs.append(Job(name=name, decoder=decoder, models=models, sample_set=sample_sets[name]))
        generate_all(jobs, specs, batch_size=cfg.batch_size, warmup_batches=cfg.warmup_batches,
                     timing=timing, device=device)
    bound: dict[str, Any] = {}  # decoder -> the binding of its SampleSet
    frames: list[pd.DataFrame] = []
    failures: list[str] = []
    verdicts: dict[tuple[str, str], pd.DataFrame] = {}  # (decoder, evaluator) -> per-image verdicts
    for name, sample_set in sample_sets.items():
        bound[name] = sample_set.binding()
        if "evaluate" in cfg.stages:
            _warn_if_bound_elsewhere(cfg, name, bound[name])
            sample_set.require_complete(full_plan)  # every shard's samples, not only this job's
            sample_set.consolidate()
            frames += _evaluate(cfg, name, sample_set.view(full_plan), evaluators, out_dir, verdicts,
                                failures, setting=decoder_setting(cfg, name, bound[name]))
            _write_summary(out_dir, frames, verdicts)
    summary = _write_summary(out_dir, frames, verdicts)
    extra.update(sample_sets=bound, summary_rows=len(summary))
    provenance.write_run_json(out_dir / "run.json", OmegaConf.to_container(cfg, resolve=True), extra)
    if not summary.empty:
        log.info("results (the full table: %s)\n%s", out_dir / results.SUMMARY_NAME, results.headline(summary))
        _report(cfg, out_dir)
    warn_noisy_timing(summary, timing.noise_threshold)
    if failures:
        raise EvaluationFailedError(
            f"{len(failures)} evaluation(s) failed: {'; '.join(failures)}. The other rows are in "
            f"{out_dir / results.SUMMARY_NAME}; fix the cause and rerun with stages=[evaluate] "
            f"samples_dir={samples_root} to score again")
    return summary


def _report(cfg: DictConfig, out_dir: Path) -> None:
    """Write the run's static HTML report under <run dir>/report and name it: its index.html shows
    this run's tables (every column defined) and figures; a failure to draw is logged, never fatal
    to the run."""
    if not cfg.get("report", True):
        return
    from harness.report.tables import run_report  # matplotlib only when a report is wanted

    try:
        run_report(out_dir, out_dir / "report")
    except Exception as err:  # noqa: BLE001 - a report is a view of results already written
        log.warning("no HTML report: %s: %s", type(err).__name__, err)
        return
    log.info("report: %s", out_dir / "report" / "index.html")


def _write_summary(out_dir: Path, frames: list[pd.DataFrame],
                   verdicts: dict[tuple[str, str], pd.DataFrame]) -> pd.DataFrame:
    """Derive the cross-decoder rows and write summary.csv atomically (after every decoder, so an
    interrupted or failing job keeps what it scored)."""
    if not frames:
        return pd.DataFrame()
    summary = with_comparisons(pd.concat(frames, ignore_index=True), verdicts)
    results.write_summary(out_dir / results.SUMMARY_NAME, summary)
    return summary


def with_comparisons(summary: pd.DataFrame, verdicts: dict[tuple[str, str], pd.DataFrame]) -> pd.DataFrame:
    """`summary` (the evaluators' rows of a job, with run columns) plus the rows that compare each
    decoder with raster: speedup_vs_raster (with its interval) and geneval_gap_vs_raster.
    `verdicts`: per-image tables by (decoder, evaluator name)."""
    return _with_geneval_gap(_with_speedup(summary, verdicts), verdicts)


def _weights_id(bundle: ModelBundle) -> str:
    """The bundle's declared weights id (e.g. its manifest's digest), else a digest of the
    parameters of its image models."""
    if bundle.weights_id:
        return bundle.weights_id
    return "params:" + provenance.weights_digest([bundle.target, bundle.drafter, bundle.small_drafter])


def sample_binding(cfg: DictConfig, decoder: str, weights: str, device: torch.device) -> dict[str, Any]:
    """What a decoder's SampleSet is bound to: the model (config and weights digest), the decoder
    configuration, sampling, seed, engine and device type. Timing-only keys (batch size, warm-up,
    threads) and where the weights are read from are left out, so a resumed or sharded run with
    other timing settings shares the set. A stored set is resumed when the two bindings agree once
    options at their defaults are left out (harness/binding.py: sets outlive new options)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    return {
        "format": BINDING_FORMAT,
        "model": {"name": cfg.model.get("name", "model"),
                  **_without(resolved["model"], _LOCATION_KEYS | _DECODER_KEYS)},
        "weights": weights,
        "decoder": {"name": decoder, **_without(resolved["decoder"][decoder], frozenset({"paper_setting"}))},
        "sampling": _without(resolved["sampling"], frozenset({"_target_"})),
        "seed": cfg.seed,
        "engine": str(cfg.get("engine") or "eager"),
        "device": device.type,
    }


def _without(tree: Any, keys: frozenset[str]) -> Any:
    """`tree` with every dict key in `keys` removed, at any depth."""
    if isinstance(tree, dict):
        return {k: _without(v, keys) for k, v in tree.items() if k not in keys}
    return tree


def _warn_if_bound_elsewhere(cfg: DictConfig, decoder: str, stored: dict[str, Any] | None) -> None:
    """An evaluate-only run scores what the set holds: say so when its binding differs from this
    job's decoder, sampling or seed (run.json records the stored binding under sample_sets)."""
    if stored is None or "generate" in cfg.stages:
        return
    now = sample_binding(cfg, decoder, str(stored.get("weights", "")), torch.device(str(stored.get("device", "cpu"))))
    keys = ("decoder", "sampling", "seed", "model")
    diffs = binding_differences({k: stored.get(k) for k in keys}, {k: now[k] for k in keys}, without_defaults)
    if diffs:
        log.warning("[%s] the samples were made under another configuration than this job's (%s); "
                    "the rows describe the stored samples (their binding is in run.json)",
                    decoder, "; ".join(diffs[:5]))


def _check_shard_stages(cfg: DictConfig) -> None:
    """A shard job (shard.count > 1) cannot also evaluate: the other shards may still be running."""
    if cfg.shard.count > 1 and "generate" in cfg.stages and "evaluate" in cfg.stages:
        raise ValueError(
            f"shard {cfg.shard.index} of {cfg.shard.count}: a shard job cannot evaluate, since the "
            "other shards may not be complete. Generate with stages=[generate] and a samples_dir "
            "shared by all shards, then score the merged set once with stages=[evaluate] "
            "samples_dir=<that folder> (docs/slurm.md)")


def _writable(folder: Path, what: str) -> None:
    """Create `folder` or fail with an error that names it and the fix."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write_probe.{uuid.uuid4().hex[:12]}"  # unique: shard jobs share folders
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise NotWritableError(f"{what} {folder} is not writable ({err.strerror or err}); "
                               "point it to a writable folder") from err


def _run_columns(cfg: DictConfig, decoder: str, setting: str | None = None) -> dict[str, Any]:
    """The columns that say which run a row comes from; `setting` (decoder_setting) where the
    decoder ran otherwise than in the paper."""
    cols = {"experiment": cfg.name, "model": cfg.model.get("name", "model"), "decoder": decoder,
            "dataset": cfg.dataset.get("name", "dataset"), "engine": str(cfg.get("engine") or "eager")}
    if setting:
        cols[SETTING_COLUMN] = setting
    for key in cfg.get("swept_keys") or []:
        cols[str(key)] = OmegaConf.select(cfg, str(key))
    return cols


def decoder_setting(cfg: DictConfig, decoder: str, bound: dict[str, Any] | None = None) -> str | None:
    """The decoder's setting, e.g. "k=32, δ=0.4, on_reject=pooled", where it differs from the paper's;
    None at the paper's setting or for a decoder whose config declares none (`paper_setting`: the
    paper's values of the keys a world's operating point may move). Read from the binding of the
    images scored (`bound`: a stored set made under another setting is labelled with its own), else
    from this job's config; a key the binding predates has its target's default (harness/binding.py)."""
    node = (cfg.get("decoder") or {}).get(decoder)
    paper = node.get("paper_setting") if node is not None else None
    if not paper:
        return None
    stored = (bound or {}).get("decoder")
    used = stored if isinstance(stored, dict) else OmegaConf.to_container(node, resolve=True)
    pairs = [(path, value, _value_at(used, path))
             for path, value in _leaves(OmegaConf.to_container(paper, resolve=True))]
    if all(_json_equal(value, now) for _, value, now in pairs):
        return None
    from harness.report.specs import swept_label  # plain labels (no plotting library)

    return ", ".join(f"{swept_label('.'.join(path))}={_plain(now)}" for path, _, now in pairs)


def _leaves(tree: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """(key path, value) of every leaf of a nested dict."""
    if not isinstance(tree, dict):
        return [(path, tree)]
    return [leaf for key, value in tree.items() for leaf in _leaves(value, (*path, str(key)))]


def _value_at(tree: Any, path: tuple[str, ...]) -> Any:
    """The value at `path` in a decoder node; a missing last key reads as its `_target_`'s default."""
    for key in path[:-1]:
        tree = tree.get(key) if isinstance(tree, dict) else None
    if not isinstance(tree, dict):
        return None
    if path[-1] in tree:
        return tree[path[-1]]
    target = tree.get("_target_")
    return signature_defaults(target).get(path[-1]) if isinstance(target, str) else None


def _json_equal(a: Any, b: Any) -> bool:
    """Equal as config values (1000 == 1000.0; a string only equals the same string)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def _plain(value: Any) -> str:
    """A setting value as shown: numbers without trailing zeros."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _evaluate(cfg: DictConfig, decoder: str, sample_set: SampleSet, evaluators: list[Evaluator],
              out_dir: Path, verdicts: dict[tuple[str, str], pd.DataFrame],
              failures: list[str], setting: str | None = None) -> list[pd.DataFrame]:
    """Summary rows of every evaluator on one decoder's samples (with a `setting` column where the
    decoder ran otherwise than in the paper); per-image results are written to
    per_sample/<decoder>/<evaluator>.csv and kept in `verdicts`. An evaluator that fails is logged
    and named in `failures`; the others still run."""
    frames = []
    for ev in evaluators:
        try:
            res = ev.evaluate(sample_set)
        except Exception as err:  # noqa: BLE001 - any failure: keep the other evaluators' rows
            log.error("[%s] evaluator %s failed: %s: %s", decoder, ev.name, type(err).__name__, err,
                      exc_info=not isinstance(err, InputError))
            failures.append(f"{ev.name} on {decoder} ({type(err).__name__}: {err})")
            continue
        table = res.summary.copy()
        for key, val in reversed(_run_columns(cfg, decoder, setting).items()):
            table.insert(0, key, val)
        table.insert(len(RUN_KEYS), "evaluator", ev.name)
        table.insert(len(RUN_KEYS) + 1, "evaluator_version", ev.version)
        frames.append(table)
        if res.per_sample is not None:
            path = out_dir / "per_sample" / decoder / f"{ev.name}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, res.per_sample.to_csv(index=False).encode())
            verdicts[(decoder, ev.name)] = res.per_sample
    return frames


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
    log.warning("timing unreliable for %s: timing_noise (%s) above timing.noise_threshold %.2f. Repeated "
                "decodes of the same images disagree, or the decoding thread was kept off the CPU (another "
                "process?); do not trust these decoders' latencies and speed-ups. Rerun on a quiet "
                "machine (docs/methodology.md).", ", ".join(names), figures, threshold)
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
