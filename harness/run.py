"""The pipeline of one job: prompts -> condition -> decode (timed) -> images -> SampleSet ->
evaluators -> summary.csv + run.json + a printed table."""
from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from harness.results import paired_difference
from harness import provenance, results
from harness.api import (ConfigValueError, Decoder, Evaluator, InputError, ModelBundle, SamplingParams,
                         checked_number)
from harness.datasets.prompts import select
from harness.generate import generate
from harness.models.guidance import Guided
from harness.samples import NotWritableError, SampleSet, binding_differences, plan, write_atomic

log = logging.getLogger(__name__)

RUN_KEYS = ("experiment", "model", "decoder", "dataset")
STAGES = ("generate", "evaluate")
BINDING_FORMAT = 1
# Model config keys that say where or how weights are loaded, not which weights: left out of a
# SampleSet's binding (the weights themselves are bound by their digest).
_LOCATION_KEYS = frozenset({"sampling", "device", "cache_dir", "local_dir", "local_path", "trust_pickle", "name"})


class EvaluationFailedError(RuntimeError):
    """One or more evaluators failed; the rows of the others were written."""


def _build(node: DictConfig, drop: tuple[str, ...] = ("name",)) -> Any:
    """Instantiate a config node without its informational keys (`name`; a model's `sampling`
    holds its recommended sampling defaults, which `conf/config.yaml` reads)."""
    conf = OmegaConf.to_container(node, resolve=True)
    assert isinstance(conf, dict)
    for key in drop:
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


def _evaluators(cfg: DictConfig) -> list[Evaluator]:
    return [_build(node, drop=()) for node in (cfg.get("evaluator") or {}).values()]


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
    decoders = _decoders(cfg)
    prompts = select(_build(cfg.dataset), cfg.dataset_limit)
    if not prompts:
        raise ConfigValueError(f"dataset {cfg.dataset.get('name', '')!r} holds no prompt; check dataset.n, "
                               "dataset.path or dataset_limit")
    specs = plan(prompts, cfg.images_per_prompt, cfg.seed, shard=cfg.shard.index, num_shards=cfg.shard.count)
    full_plan = plan(prompts, cfg.images_per_prompt, cfg.seed)  # what an evaluate stage scores
    _check_shard_stages(cfg)
    evaluators = _evaluators(cfg) if "evaluate" in cfg.stages else []  # bad evaluator config: fail now
    samples_root = Path(cfg.samples_dir) if cfg.samples_dir else out_dir / "samples"
    if "generate" in cfg.stages:
        _writable(samples_root, "samples directory (samples_dir)")
    extra: dict[str, Any] = {"seed": cfg.seed, "prompts": len(prompts), "samples": len(specs)}
    provenance.write_run_json(out_dir / "run.json", OmegaConf.to_container(cfg, resolve=True), extra)
    bundle: ModelBundle | None = None
    weights = ""
    bound: dict[str, Any] = {}  # decoder -> the binding of its SampleSet
    frames: list[pd.DataFrame] = []
    failures: list[str] = []
    verdicts: dict[tuple[str, str], pd.DataFrame] = {}  # (decoder, evaluator) -> per-image verdicts
    for name, dec_cfg in decoders.items():
        sample_set = SampleSet(samples_root / name)
        if "generate" in cfg.stages:
            if bundle is None:
                bundle = _build(cfg.model, drop=("name", "sampling"))
                weights = _weights_id(bundle)
                bundle = bundle.to(device)
                bundle.name = str(cfg.model.get("name", bundle.name))
            decoder: Decoder = _build(dec_cfg)
            sample_set.bind(sample_binding(cfg, name, weights, device),
                            overwrite=bool(cfg.get("overwrite_samples", False)))
            models = guided(bundle, decoder.sampling)  # type: ignore[attr-defined]
            generate(decoder, models, sample_set, specs, batch_size=cfg.batch_size,
                     warmup_batches=cfg.warmup_batches, device=device, name=name)
        bound[name] = sample_set.binding()
        if "evaluate" in cfg.stages:
            _warn_if_bound_elsewhere(cfg, name, bound[name])
            sample_set.require_complete(full_plan)  # every shard's samples, not only this job's
            sample_set.consolidate()
            frames += _evaluate(cfg, name, sample_set.view(full_plan), evaluators, out_dir, verdicts,
                                failures)
            _write_summary(out_dir, frames, verdicts)
    summary = _write_summary(out_dir, frames, verdicts)
    extra.update(sample_sets=bound, summary_rows=len(summary))
    provenance.write_run_json(out_dir / "run.json", OmegaConf.to_container(cfg, resolve=True), extra)
    if not summary.empty:
        log.info("results in %s\n%s", out_dir, results.format_table(summary))
    if failures:
        raise EvaluationFailedError(
            f"{len(failures)} evaluation(s) failed: {'; '.join(failures)}. The other rows are in "
            f"{out_dir / results.SUMMARY_NAME}; fix the cause and rerun with stages=[evaluate] "
            f"samples_dir={samples_root} to score again")
    return summary


def _write_summary(out_dir: Path, frames: list[pd.DataFrame],
                   verdicts: dict[tuple[str, str], pd.DataFrame]) -> pd.DataFrame:
    """Derive the cross-decoder rows and write summary.csv atomically (after every decoder, so an
    interrupted or failing job keeps what it scored)."""
    if not frames:
        return pd.DataFrame()
    summary = pd.concat(frames, ignore_index=True)
    summary = _with_speedup(summary)
    summary = _with_geneval_gap(summary, verdicts)
    results.write_summary(out_dir / results.SUMMARY_NAME, summary)
    return summary


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
    other timing settings shares the set."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    return {
        "format": BINDING_FORMAT,
        "model": {"name": cfg.model.get("name", "model"), **_without(resolved["model"], _LOCATION_KEYS)},
        "weights": weights,
        "decoder": {"name": decoder, **resolved["decoder"][decoder]},
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
    diffs = binding_differences({k: stored.get(k) for k in keys}, {k: now[k] for k in keys})
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


def _run_columns(cfg: DictConfig, decoder: str) -> dict[str, Any]:
    cols = {"experiment": cfg.name, "model": cfg.model.get("name", "model"), "decoder": decoder,
            "dataset": cfg.dataset.get("name", "dataset")}
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


def _with_speedup(summary: pd.DataFrame) -> pd.DataFrame:
    """Add `speedup_vs_raster` (raster median latency / decoder median latency) when a raster
    run is in the same job: the side-by-side ratio the paper reports."""
    lat = summary[(summary.metric == "latency_s") & (summary.subset == "all")]
    base = lat[lat.decoder == "raster"]
    if base.empty:
        return summary
    ref = float(base.value.iloc[0])
    rows = lat.copy()
    rows["metric"] = "speedup_vs_raster"
    rows["value"] = ref / rows["value"].astype(float)
    rows["stderr"] = float("nan")
    rows["higher_is_better"] = True
    return pd.concat([summary, rows], ignore_index=True)


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
