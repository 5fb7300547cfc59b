"""The pipeline of one job: prompts -> condition -> decode (timed: harness/generate.py) -> images ->
SampleSet -> evaluators -> summary.csv + run.json + a printed table.

Every decoder of the job is built and its SampleSet bound before the generate stage, which times
them all together (interleaved, repeated: harness.generate.generate_all). After the evaluators, the
job adds the rows that compare decoders with raster: `speedup_vs_raster` with a bootstrap
confidence interval (`stderr`, `ci_low`, `ci_high`; `speedup_interval`) and `geneval_gap_vs_raster`
with its paired standard error, and warns about decoders whose `timing_noise` exceeds
`timing.noise_threshold`."""
from __future__ import annotations

import difflib
import logging
import math
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf

from harness import engine, preflight, provenance, results
from harness.results import paired_difference
from harness.api import (INTERVAL_COLUMNS, ConfigValueError, Decoder, Evaluator, InputError, ModelBundle,
                         SamplingParams, checked_number)
from harness.binding import without_defaults
from harness.datasets.prompts import select
from harness.generate import Job, Timing, generate_all
from harness.models.guidance import Guided
from harness.samples import (BINDING_FILE, BindingMismatchError, NotWritableError, SampleSet,
                             binding_differences, plan, write_atomic)

log = logging.getLogger(__name__)

RUN_KEYS = ("experiment", "model", "decoder", "dataset")
STAGES = ("fetch", "generate", "evaluate")
BINDING_FORMAT = 1
BOOTSTRAP_DRAWS = 2000  # resamples of the speed-up's confidence interval
CI_LEVEL = 0.95
# Model config keys that say where or how weights are loaded, not which weights: left out of a
# SampleSet's binding (the weights themselves are bound by their digest).
_LOCATION_KEYS = frozenset({"sampling", "device", "cache_dir", "local_dir", "local_path", "trust_pickle", "name"})


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
    if "evaluate" in cfg.stages and "generate" not in cfg.stages:  # a generate stage bound them
        for name, sample_set in sample_sets.items():  # before any row is written
            _check_stored_labels(cfg, name, sample_set.root, sample_set.binding())
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
                                failures)
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
    diffs = binding_differences({k: stored.get(k) for k in keys}, {k: now[k] for k in keys}, without_defaults)
    if diffs:
        log.warning("[%s] the samples were made under another configuration than this job's (%s); "
                    "the rows describe the stored samples (their binding is in run.json)",
                    decoder, "; ".join(diffs[:5]))


def _check_stored_labels(cfg: DictConfig, decoder: str, root: Path, stored: dict[str, Any] | None) -> None:
    """An evaluate-only run labels its rows with the job's values of `swept_keys`: refuse when a key
    that describes the decoder's images (sampling, seed, model, engine, its own options) holds
    another value than the one the stored samples were made with (rows label what was scored), or
    when the set has no binding to check it against (`_check_unbound`)."""
    keys = [str(k) for k in cfg.get("swept_keys") or [] if _binding_key(str(k), decoder) is not None]
    if stored is None:
        _check_unbound(decoder, root, keys)
        return
    if not keys:
        return
    device = torch.device(str(stored.get("device", "cpu")))
    now = sample_binding(cfg, decoder, str(stored.get("weights", "")), device)
    parts = ("decoder", "sampling", "seed", "model", "engine")
    diffs = binding_differences({k: stored.get(k) for k in parts}, {k: now[k] for k in parts},
                                without_defaults)
    for key in keys:
        bound_as = str(_binding_key(key, decoder))
        # each difference reads "<binding key>: stored X, now Y"; a swept node covers its leaves
        differ = [d for d in diffs if d.split(": stored ", 1)[0] == bound_as or d.startswith(f"{bound_as}.")]
        if not differ:
            continue
        value = _dotted(stored, bound_as)
        fix = (f"set {key}={_override(value)} (the stored value)" if value is not _ABSENT
               else f"set {key} to its default (the set was made before the option existed)")
        label = f"{key}={_override(OmegaConf.select(cfg, key))}"
        raise BindingMismatchError(
            f"swept_keys labels the rows of {decoder} with {label}, but the samples in {root} were made "
            f"with another value ({'; '.join(differ[:3])}; {root / BINDING_FILE}): the rows would carry a "
            f"value their images were not made with. To re-score these images, {fix}; to score that "
            "value, generate its samples (stages=[generate,evaluate] with a fresh samples_dir)")


def _check_unbound(decoder: str, root: Path, keys: list[str]) -> None:
    """A set without binding.json: what made it is unknown. Refuse swept `keys` that would label
    its images with values nothing can check; otherwise warn, naming the folder."""
    if keys:
        raise BindingMismatchError(
            f"swept_keys labels the rows of {decoder} with {', '.join(keys)}, but the samples in {root} "
            f"have no {BINDING_FILE} (made before bindings existed, or the file was removed): what made "
            "them is unknown, so the labels cannot be checked. Regenerate the set so it is bound "
            f"(stages=[generate,evaluate] samples_dir={root.parent} overwrite_samples=true), or score "
            "it without those labels (swept_keys=[])")
    log.warning("[%s] the samples in %s have no %s (made before bindings existed, or the file was "
                "removed): the configuration that made them cannot be checked against this job's, and "
                "the rows describe whatever the set holds. Regenerate it with overwrite_samples=true to "
                "bind it", decoder, root, BINDING_FILE)


_ABSENT = object()


def _binding_key(key: str, decoder: str) -> str | None:
    """The dotted key under which config key `key` is bound in `decoder`'s SampleSet binding
    (sample_binding), or None when it does not describe that decoder's images (another decoder's
    options, timing, where weights are read from)."""
    head, _, rest = key.partition(".")
    if head == "decoder":
        name, _, option = rest.partition(".")
        return f"decoder.{option}" if name == decoder and option else None
    if head == "model":
        return key if rest and not set(rest.split(".")) & _LOCATION_KEYS else None
    return key if head == "sampling" or key in ("seed", "engine") else None


def _dotted(tree: Any, key: str) -> Any:
    """The value at dotted `key` of nested dicts, or _ABSENT."""
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


def _override(value: Any) -> str:
    """`value` as written in a command-line override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


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
