"""The pipeline of one job: prompts -> condition -> decode (timed: harness/generate.py) -> images ->
SampleSet -> evaluators -> summary.csv + run.json + a printed table.

Every decoder of the job is built and its SampleSet bound before the generate stage, which times
them all together (interleaved, repeated: harness.generate.generate_all). After the evaluators, the
job adds the rows that compare decoders with raster (harness/comparisons.py) and warns about
decoders whose `timing_noise` exceeds `timing.noise_threshold`."""
from __future__ import annotations

import dataclasses
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from harness import moved, preflight
from harness.assets import mirror
from harness.api import SETTING_COLUMN, ConfigValueError, Evaluator, InputError, ModelBundle, SamplingParams
from harness.checks import build as _build
from harness.checks import build_decoder, check_config, check_evaluator_name, timing_of
from harness.comparisons import decoder_setting, joined, model_setting, warn_noisy_timing, with_comparisons
from harness.datasets.prompts import select
from harness.generate import Job, Timing, generate_all
from harness.models.guidance import Guided
from harness.runtime import engine
from harness.store import provenance, summary
from harness.store.conditions import CONDITIONS_DIR, ConditionCache
from harness.store.binding import check_stored, compared, sample_binding, trust_targets_of
from harness.store.samples import NotWritableError, SampleSet, plan, write_atomic

log = logging.getLogger(__name__)

RUN_KEYS = ("experiment", "model", "decoder", "dataset")


class EvaluationFailedError(RuntimeError):
    """One or more evaluators failed; the rows of the others were written."""


NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")  # present where an NVIDIA kernel driver is loaded


def _device(name: str) -> torch.device:
    """The job's device; `auto` is CUDA where torch can use it, else the CPU, said loudly where a GPU
    is there but this torch cannot use it (a CUDA build newer than the node's driver: a GPU job
    would run on the CPU for weeks)."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if NVIDIA_DRIVER.is_file():
            lines = NVIDIA_DRIVER.read_text(errors="replace").splitlines()
            driver = lines[0].strip() if lines else ""
            log.warning("device=auto: an NVIDIA driver is loaded (%s) but this torch (%s, CUDA %s) cannot use the "
                        "GPU, so the job runs on the CPU, far slower. Install a torch built for this driver "
                        "(docs/install.md), or pass device=cpu to run on the CPU on purpose",
                        driver or "version unknown", torch.__version__, torch.version.cuda)
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigValueError(f"device={name} requested but CUDA is not available; use device=cpu or device=auto")
    return torch.device(name)


def require_cuda(device: torch.device) -> None:
    """Stop a job that must generate on a GPU (`require_cuda: true`, the paper experiments) when this
    torch cannot use one, naming why and the fix, before any weight is loaded.

    Raises:
        ConfigValueError: the device is not CUDA.
    """
    if device.type == "cuda":
        return
    lines = NVIDIA_DRIVER.read_text(errors="replace").splitlines() if NVIDIA_DRIVER.is_file() else []
    driver = lines[0].strip() if lines else "no NVIDIA driver is loaded on this machine"
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    raise ConfigValueError(
        f"this experiment generates on a GPU (require_cuda: true) but runs on {device.type}: "
        f"torch.cuda.is_available() is {torch.cuda.is_available()}, driver: {driver}, torch {torch.__version__} "
        f"is {build}. Install the torch build that matches the node's driver first (e.g. `pip install torch "
        "--index-url https://download.pytorch.org/whl/cu126` for drivers >= 560, cu130 needs >= 580; "
        "docs/install.md), run on a GPU node, or pass require_cuda=false to generate on the CPU on purpose")


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
    """The evaluators `names` (those the preflight plan keeps), instantiated.

    Raises:
        ConfigValueError: an evaluator's `name` is not a plain file name (per_sample/<decoder>/<name>.csv).
    """
    built = {key: _build(node, drop=()) for key, node in (cfg.get("evaluator") or {}).items() if key in names}
    for key, evaluator in built.items():
        check_evaluator_name(key, evaluator.name)
    return list(built.values())


def _check_evaluators(evaluators: list[Evaluator]) -> None:
    """Each evaluator's own check of what it needs on this machine (its `check()`: imports, an official
    environment, its checkout and commit, its files), before anything is generated."""
    for evaluator in evaluators:
        if hasattr(evaluator, "check"):
            evaluator.check()


def _warn_evaluate_stage(cfg: DictConfig, names: list[str]) -> None:
    """A generate-only job (a shard) warns when the evaluate stage of the same command would stop on
    this machine (its evaluators' `check()`), so that the fix is made while the shards run."""
    try:
        _check_evaluators(_evaluators(cfg, names))
    except InputError as err:
        log.warning("the evaluate stage of this command will stop unless this is fixed first: %s", err)


def run(cfg: DictConfig, out_dir: Path) -> pd.DataFrame:
    """Run the configured stages; return the long summary table of this job.

    Raises:
        EvaluationFailedError: an evaluator failed; the other evaluators' rows were written.
    """
    moved.updated(cfg)  # old `_target_` paths of a user's config, with a warning
    mirror.use(OmegaConf.select(cfg, "assets.mirror"))  # downloads read through it, here and in subprocesses
    trust_targets_of(cfg)
    check_config(cfg)
    _writable(out_dir, "results directory (hydra.run.dir)")
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    device = _device(cfg.device)
    if cfg.get("require_cuda") and "generate" in cfg.stages:
        require_cuda(device)
    if "generate" in cfg.stages:  # scoring stored samples compiles nothing
        engine.check(str(cfg.get("engine") or "eager"), device)
        if slow := preflight.cpu_dtype_warning(cfg.model, device):
            log.warning("%s", slow)
    jobs_plan = preflight.check(cfg)  # incompatible decoders / evaluators, missing weights: before anything
    decoders = {n: node for n, node in _decoders(cfg).items() if n in jobs_plan.decoders}
    if not decoders:
        raise preflight.IncompatibleError(f"no decoder left to run on model {cfg.model.get('name')}: "
                                          f"{jobs_plan.skipped}")
    if CONDITIONS_DIR in decoders:  # its SampleSet would share the folder of the condition cache
        raise ConfigValueError(f"decoder.{CONDITIONS_DIR}: a decoder cannot be named {CONDITIONS_DIR!r}, the "
                               "folder of the condition cache in samples_dir; give it another name")
    timing = shard_timing(timing_of(cfg), int(cfg.shard.index), int(cfg.shard.count))
    if "fetch" in cfg.stages:
        preflight.fetch(cfg, _evaluators(cfg, jobs_plan.evaluators), jobs_plan.decoders)
        if list(cfg.stages) == ["fetch"]:
            return pd.DataFrame()
    start = int(cfg.get("dataset_start") or 0)
    prompts = select(_build(cfg.dataset)[start:], cfg.dataset_limit)
    if not prompts:
        raise ConfigValueError(f"dataset {cfg.dataset.get('name', '')!r} holds no prompt; check dataset.n, "
                               "dataset.path, dataset_start or dataset_limit")
    preflight.check_metadata(cfg, jobs_plan, prompts)  # what the evaluators read, before generating
    specs = plan(prompts, cfg.images_per_prompt, cfg.seed, shard=cfg.shard.index, num_shards=cfg.shard.count)
    full_plan = plan(prompts, cfg.images_per_prompt, cfg.seed)  # what an evaluate stage scores
    _check_shard_stages(cfg)
    evaluators = _evaluators(cfg, jobs_plan.evaluators) if "evaluate" in cfg.stages else []  # fail now
    if "evaluate" in cfg.stages:
        preflight.check_evaluate_device(cfg, jobs_plan.evaluators)
    preflight.check_offline(cfg, evaluators, jobs_plan.decoders)  # offline: every file the stages read is here
    if "generate" in cfg.stages:
        preflight.fetch_decoder_assets(cfg, jobs_plan.decoders)  # a decoder's pinned file: not in a timed decode
    _check_evaluators(evaluators)
    if "generate" in cfg.stages and "evaluate" not in cfg.stages:
        _warn_evaluate_stage(cfg, jobs_plan.evaluators)
    samples_root = Path(cfg.samples_dir) if cfg.samples_dir else out_dir / "samples"
    if "generate" in cfg.stages:
        _writable(samples_root, "samples directory (samples_dir)")
    log.info("%s", preflight.describe(cfg, jobs_plan, len(prompts), len(full_plan)))
    extra: dict[str, Any] = {"seed": cfg.seed, "prompts": len(prompts), "samples": len(specs),
                             "plan": preflight.to_dict(jobs_plan)}
    provenance.write_run_json(out_dir / "run.json", OmegaConf.to_container(cfg, resolve=True), extra)
    sample_sets = {name: SampleSet(samples_root / name) for name in decoders}
    if "generate" in cfg.stages:
        built = {name: build_decoder(name, node) for name, node in decoders.items()}  # options first
        bundle = _build(preflight.model_for(cfg, jobs_plan.decoders), drop=("name", "sampling"))
        bundle.name = str(cfg.model.get("name", bundle.name))
        _check_fits(built, bundle, 2 * max(int(cfg.batch_size), int(timing.batch_size or 0)), device)
        weights, head = provenance.weights_ids(bundle)
        bundle = bundle.to(device)
        engine.apply(bundle, str(cfg.get("engine") or "eager"), device)
        engine.reserve(bundle, built.values(), max(int(cfg.batch_size), int(timing.batch_size or 0)))
        bundle.name = str(cfg.model.get("name", bundle.name))
        generation = getattr(getattr(bundle.conditioner, "stage", None), "generation", None)
        if generation is not None:  # the LLM's effective generation config (Tar), in run.json
            extra["llm_generation"] = generation
        jobs = []
        for name, decoder in built.items():  # every set bound before anything is generated
            own = weights + head if preflight.drafts_with_head(decoders[name]) else weights
            sample_sets[name].bind(sample_binding(cfg, name, own, device),
                                   overwrite=bool(cfg.get("overwrite_samples", False)),
                                   compared=compared)  # old paths current, options at their defaults left out
            models = guided(bundle, decoder.sampling)  # type: ignore[attr-defined]
            jobs.append(Job(name=name, decoder=decoder, models=models, sample_set=sample_sets[name]))
        model_config = OmegaConf.to_container(cfg.model, resolve=True)
        conditions_root = Path(cfg.conditions_dir) if cfg.get("conditions_dir") else samples_root / CONDITIONS_DIR
        conditions = ConditionCache(conditions_root, model=bundle.name,
                                    config=model_config if isinstance(model_config, dict) else None, device=device)
        generate_all(jobs, specs, batch_size=cfg.batch_size, warmup_batches=cfg.warmup_batches,
                     timing=timing, device=device, conditions=conditions,
                     evaluate=preflight.evaluate_costs(cfg, jobs_plan.evaluators, len(full_plan) * len(decoders)))
    if "evaluate" in cfg.stages and "generate" not in cfg.stages:  # a generate stage bound them
        for name, sample_set in sample_sets.items():  # before any row is written
            check_stored(cfg, name, sample_set.root, sample_set.binding())
    bound: dict[str, Any] = {}  # decoder -> the binding of its SampleSet
    frames: list[pd.DataFrame] = []
    failures: list[tuple[str, str, str]] = []  # (evaluator, decoder, why)
    verdicts: dict[tuple[str, str], pd.DataFrame] = {}  # (decoder, evaluator) -> per-image verdicts
    for name, sample_set in sample_sets.items():
        bound[name] = sample_set.binding()
        if "evaluate" in cfg.stages:
            sample_set.require_complete(full_plan)  # every shard's samples, not only this job's
            sample_set.consolidate()
            frames += _evaluate(cfg, name, sample_set.view(full_plan), evaluators, out_dir, verdicts,
                                failures, setting=joined(decoder_setting(cfg, name, bound[name]),
                                                         model_setting(cfg)))
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
            f"{len(failures)} evaluation(s) failed: {_failure_list(failures)}. The other rows are in "
            f"{out_dir / summary.SUMMARY_NAME}; fix the cause and rerun with stages=[evaluate] "
            f"samples_dir={samples_root} to score again")
    return table


def _failure_list(failures: list[tuple[str, str, str]]) -> str:
    """`failures` (evaluator, decoder, why) as "geneval on raster, zipar (ValueError: ...)": one
    entry per evaluator and cause, so a cause shared by every decoder is said once."""
    decoders: dict[tuple[str, str], list[str]] = {}
    for evaluator, decoder, why in failures:
        decoders.setdefault((evaluator, why), []).append(decoder)
    return "; ".join(f"{evaluator} on {', '.join(names)} ({why})"
                     for (evaluator, why), names in decoders.items())


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
    table = with_comparisons(pd.concat(frames, ignore_index=True), verdicts)
    summary.write_summary(out_dir / summary.SUMMARY_NAME, table)
    return table


def shard_timing(timing: Timing, index: int, count: int) -> Timing:
    """The timing of shard `index` of `count`: with a finite `timing.images` only shard 0 times (its
    first images), the other shards decode every image once, untimed, so a sharded job times one
    set of images per decoder as an unsharded one does (docs/slurm.md). With `timing.images` null
    (every image timed) each shard times its own images."""
    if count > 1 and index > 0 and timing.images is not None:
        return dataclasses.replace(timing, images=0)
    return timing


def _check_fits(decoders: dict[str, Any], bundle: ModelBundle, rows: int, device: torch.device) -> None:
    """ConfigValueError naming `decoder.<name>.<option>` when a decoder's options cannot fit the
    built model (its `misfit`: a draft tree wider than the codebook, or too large for the device's
    memory at `rows` rows), before any SampleSet is bound or anything generated."""
    memory = _device_memory(device)
    for name, decoder in decoders.items():
        misfit = getattr(decoder, "misfit", None)
        found = misfit(bundle, rows, memory) if callable(misfit) else None
        if found is not None:
            option, why = found
            raise ConfigValueError(f"decoder.{name}.{option} {why}")


def _device_memory(device: torch.device) -> int:
    """Bytes of memory of `device`: the GPU's total, else the host's physical memory."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): no bound
        return 1 << 62


def _check_shard_stages(cfg: DictConfig) -> None:
    """A shard job (shard.count > 1) cannot also evaluate: the other shards may still be running."""
    if cfg.shard.count > 1 and "generate" in cfg.stages and "evaluate" in cfg.stages:
        raise ConfigValueError(
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


def _evaluate(cfg: DictConfig, decoder: str, sample_set: SampleSet, evaluators: list[Evaluator],
              out_dir: Path, verdicts: dict[tuple[str, str], pd.DataFrame],
              failures: list[tuple[str, str, str]], setting: str | None = None) -> list[pd.DataFrame]:
    """Summary rows of every evaluator on one decoder's samples (with a `setting` column where the
    decoder ran otherwise than in the paper); per-image results are written to
    per_sample/<decoder>/<evaluator>.csv and kept in `verdicts`. An evaluator that fails is logged
    and named in `failures`; the others still run."""
    frames = []
    for ev in evaluators:
        started = time.perf_counter()
        try:
            res = ev.evaluate(sample_set)
            seconds = time.perf_counter() - started
            images = len(sample_set.records())
            log.info("[%s] evaluate %s: %d images in %.1f s (%.3g s per image)", decoder, ev.name, images, seconds,
                     seconds / max(images, 1))
        except Exception as err:  # noqa: BLE001 - any failure: keep the other evaluators' rows
            log.error("[%s] evaluator %s failed: %s: %s", decoder, ev.name, type(err).__name__, err,
                      exc_info=not isinstance(err, InputError))
            failures.append((ev.name, decoder, f"{type(err).__name__}: {err}"))
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
