"""The pipeline of one job: prompts -> condition -> decode (timed: harness/generate.py) -> images ->
SampleSet -> evaluators -> summary.csv + run.json + a printed table.

Every decoder of the job is built and its SampleSet bound before the generate stage, which times
them all together (interleaved, repeated: harness.generate.generate_all). After the evaluators, the
job adds the rows that compare decoders with raster (harness/comparisons.py) and warns about
decoders whose `timing_noise` exceeds `timing.noise_threshold`."""
from __future__ import annotations

import difflib
import logging
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf

from harness import moved, preflight
from harness.api import ConfigValueError, Decoder, Evaluator, InputError, ModelBundle, SamplingParams, checked_number
from harness.comparisons import warn_noisy_timing, with_comparisons
from harness.datasets.prompts import select
from harness.generate import Job, Timing, generate_all
from harness.models.guidance import Guided
from harness.runtime import engine
from harness.store import provenance, summary
from harness.store.binding import (check_stored_labels, compared, sample_binding, trust_targets_of,
                                   warn_if_bound_elsewhere)
from harness.store.samples import NotWritableError, SampleSet, plan, write_atomic

log = logging.getLogger(__name__)

RUN_KEYS = ("experiment", "model", "decoder", "dataset")
STAGES = ("fetch", "generate", "evaluate")


class EvaluationFailedError(RuntimeError):
    """One or more evaluators failed; the rows of the others were written."""


def _build(node: DictConfig, drop: tuple[str, ...] = ("name",)) -> Any:
    """Instantiate a config node without its informational keys (`name`; a model's `sampling`
    holds its recommended sampling defaults, which `conf/config.yaml` reads; `requires` and
    `provides` are read by harness/preflight.py)."""
    conf = OmegaConf.to_container(node, resolve=True)
    assert isinstance(conf, dict)
    for key in (*drop, "requires", "provides"):
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
    if not isinstance(cfg.get("report", True), bool):
        raise ConfigValueError(f"report must be true or false, got {cfg.report!r}")
    _check_swept_keys(cfg)
    samples_dir = cfg.get("samples_dir")
    if samples_dir is not None and (not isinstance(samples_dir, str) or Path(samples_dir).is_file()):
        raise ConfigValueError(f"samples_dir {samples_dir!r} is not a folder; point it at a folder "
                               "of per-decoder SampleSets (or null: <run dir>/samples)")


def _check_swept_keys(cfg: DictConfig) -> None:
    """Refuse a `swept_keys` that is not a list of this job's config keys naming single values (a
    typo would add a column of that name holding nothing), suggesting close matches."""
    keys = cfg.get("swept_keys")
    if keys is None:
        return
    if not isinstance(keys, ListConfig):
        raise ConfigValueError(f"swept_keys must be a list of config keys, got {keys!r}; e.g. "
                               f"swept_keys=[{keys}]")
    known = _leaf_keys(OmegaConf.to_container(cfg, resolve=False))
    for key in keys:
        if not isinstance(key, str) or not key:
            raise ConfigValueError(f"swept_keys holds {key!r}, not a config key; name keys such as "
                                   "decoder.mulo_sd.accept.tau")
        if key in known:
            continue
        inside = sorted(k for k in known if k.startswith(f"{key}.") and not k.endswith("._target_"))
        if inside:
            raise ConfigValueError(f"swept_keys names {key!r}, a config node, not a single value; name "
                                   f"the keys that vary, e.g. {', '.join(inside[:4])}")
        close = difflib.get_close_matches(key, sorted(k for k in known if not k.endswith("._target_")), n=3)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise ConfigValueError(f"swept_keys names {key!r}, which is not a key of this job's configuration"
                               f"{hint}. Correct it or remove it from swept_keys (a decoder's keys exist "
                               "only when the decoder is selected)")


def _leaf_keys(tree: Any, prefix: str = "") -> set[str]:
    """Dotted keys of the values of a config container (lists and empty nodes are values)."""
    if not isinstance(tree, dict) or (not tree and prefix):
        return {prefix} if prefix else set()
    found: set[str] = set()
    for key, value in tree.items():
        found |= _leaf_keys(value, f"{prefix}.{key}" if prefix else str(key))
    return found


def run(cfg: DictConfig, out_dir: Path) -> pd.DataFrame:
    """Run the configured stages; return the long summary table of this job.

    Raises:
        EvaluationFailedError: an evaluator failed; the other evaluators' rows were written.
    """
    moved.updated(cfg)  # old `_target_` paths of a user's config, with a warning
    trust_targets_of(cfg)
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
                                   compared=compared)  # old paths current, options at their defaults left out
            models = guided(bundle, decoder.sampling)  # type: ignore[attr-defined]
            jobs.append(Job(name=name, decoder=decoder, models=models, sample_set=sample_sets[name]))
        generate_all(jobs, specs, batch_size=cfg.batch_size, warmup_batches=cfg.warmup_batches,
                     timing=timing, device=device)
    if "evaluate" in cfg.stages and "generate" not in cfg.stages:  # a generate stage bound them
        for name, sample_set in sample_sets.items():  # before any row is written
            check_stored_labels(cfg, name, sample_set.root, sample_set.binding())
    bound: dict[str, Any] = {}  # decoder -> the binding of its SampleSet
    frames: list[pd.DataFrame] = []
    failures: list[str] = []
    verdicts: dict[tuple[str, str], pd.DataFrame] = {}  # (decoder, evaluator) -> per-image verdicts
    for name, sample_set in sample_sets.items():
        bound[name] = sample_set.binding()
        if "evaluate" in cfg.stages:
            warn_if_bound_elsewhere(cfg, name, bound[name])
            sample_set.require_complete(full_plan)  # every shard's samples, not only this job's
            sample_set.consolidate()
            frames += _evaluate(cfg, name, sample_set.view(full_plan), evaluators, out_dir, verdicts,
                                failures)
            _write_summary(out_dir, frames, verdicts)
    table = _write_summary(out_dir, frames, verdicts)
    extra.update(sample_sets=bound, summary_rows=len(table))
    provenance.write_run_json(out_dir / "run.json", OmegaConf.to_container(cfg, resolve=True), extra)
    if not table.empty:
        log.info("results (the full table: %s)\n%s", out_dir / summary.SUMMARY_NAME, summary.headline(table))
        _report(cfg, out_dir)
    warn_noisy_timing(table, timing.noise_threshold)
    if failures:
        raise EvaluationFailedError(
            f"{len(failures)} evaluation(s) failed: {'; '.join(failures)}. The other rows are in "
            f"{out_dir / summary.SUMMARY_NAME}; fix the cause and rerun with stages=[evaluate] "
            f"samples_dir={samples_root} to score again")
    return table


def _report(cfg: DictConfig, out_dir: Path) -> None:
    """Write the run's static HTML report (tables and figures) under <run dir>/report and name it;
    a failure to draw is logged, never fatal to the run."""
    if not cfg.get("report", True):
        return
    from harness.report.tables import regenerate  # matplotlib only when a report is wanted

    try:
        regenerate([out_dir], out_dir / "report", paper_rows=False)
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
    table = with_comparisons(pd.concat(frames, ignore_index=True), verdicts)
    summary.write_summary(out_dir / summary.SUMMARY_NAME, table)
    return table


def _weights_id(bundle: ModelBundle) -> str:
    """The bundle's declared weights id (e.g. its manifest's digest), else a digest of the
    parameters of its image models."""
    if bundle.weights_id:
        return bundle.weights_id
    return "params:" + provenance.weights_digest([bundle.target, bundle.drafter, bundle.small_drafter])


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


def _run_columns(cfg: DictConfig, decoder: str) -> dict[str, Any]:
    cols = {"experiment": cfg.name, "model": cfg.model.get("name", "model"), "decoder": decoder,
            "dataset": cfg.dataset.get("name", "dataset"), "engine": str(cfg.get("engine") or "eager")}
    for key in cfg.get("swept_keys") or []:
        cols[str(key)] = OmegaConf.select(cfg, str(key))
    return cols


def _evaluate(cfg: DictConfig, decoder: str, sample_set: SampleSet, evaluators: list[Evaluator],
              out_dir: Path, verdicts: dict[tuple[str, str], pd.DataFrame],
              failures: list[str]) -> list[pd.DataFrame]:
    """Summary rows of every evaluator on one decoder's samples; per-image results are written to
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
        for key, val in reversed(_run_columns(cfg, decoder).items()):
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
