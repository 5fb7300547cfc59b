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

from evaluators.geneval_rules import paired_difference
from harness import provenance, results
from harness.api import Decoder, Evaluator, ModelBundle, SamplingParams
from harness.datasets import select
from harness.generate import generate
from harness.models.guidance import Guided
from harness.samples import NotWritableError, SampleSet, plan, write_atomic

log = logging.getLogger(__name__)

RUN_KEYS = ("experiment", "model", "decoder", "dataset")


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
        raise RuntimeError(f"device={name} requested but CUDA is not available; use device=cpu or device=auto")
    return torch.device(name)


def guided(bundle: ModelBundle, sampling: SamplingParams) -> ModelBundle:
    """Wrap every model of the bundle in classifier-free guidance unless the scale is 1."""
    if sampling.cfg_scale == 1.0:
        return bundle
    wrap = lambda m: None if m is None else Guided(m, sampling.cfg_scale)  # noqa: E731
    return ModelBundle(name=bundle.name, target=wrap(bundle.target), conditioner=bundle.conditioner,
                       drafter=wrap(bundle.drafter), small_drafter=wrap(bundle.small_drafter))


def _decoders(cfg: DictConfig) -> dict[str, DictConfig]:
    if not cfg.decoder:
        raise ValueError("no decoder selected: choose one or more, e.g. decoder=[raster]")
    return {str(k): v for k, v in cfg.decoder.items()}


def _evaluators(cfg: DictConfig) -> list[Evaluator]:
    return [_build(node, drop=()) for node in (cfg.evaluator or {}).values()]


def run(cfg: DictConfig, out_dir: Path) -> pd.DataFrame:
    """Run the configured stages; return the long summary table of this job."""
    _writable(out_dir, "results directory (hydra.run.dir)")
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    device = _device(cfg.device)
    prompts = select(_build(cfg.dataset), cfg.dataset_limit)
    specs = plan(prompts, cfg.images_per_prompt, cfg.seed, shard=cfg.shard.index, num_shards=cfg.shard.count)
    full_plan = plan(prompts, cfg.images_per_prompt, cfg.seed)  # what an evaluate stage scores
    _check_shard_stages(cfg)
    samples_root = Path(cfg.samples_dir) if cfg.samples_dir else out_dir / "samples"
    if "generate" in cfg.stages:
        _writable(samples_root, "samples directory (samples_dir)")
    provenance.write_run_json(out_dir / "run.json", OmegaConf.to_container(cfg, resolve=True),
                              {"seed": cfg.seed, "prompts": len(prompts), "samples": len(specs)})
    bundle: ModelBundle | None = None
    frames = []
    verdicts: dict[tuple[str, str], pd.DataFrame] = {}  # (decoder, evaluator) -> per-image verdicts
    for name, dec_cfg in _decoders(cfg).items():
        sample_set = SampleSet(samples_root / name)
        if "generate" in cfg.stages:
            if bundle is None:
                bundle = _build(cfg.model, drop=("name", "sampling")).to(device)
                bundle.name = str(cfg.model.get("name", bundle.name))
            decoder: Decoder = _build(dec_cfg)
            models = guided(bundle, decoder.sampling)  # type: ignore[attr-defined]
            generate(decoder, models, sample_set, specs, batch_size=cfg.batch_size,
                     warmup_batches=cfg.warmup_batches, device=device, name=name)
        if "evaluate" in cfg.stages:
            sample_set.require_complete(full_plan)  # every shard's samples, not only this job's
            sample_set.consolidate()
            frames.append(_evaluate(cfg, name, sample_set, out_dir, verdicts))
    summary = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if not summary.empty:
        summary = _with_speedup(summary)
        summary = _with_geneval_gap(summary, verdicts)
        write_atomic(out_dir / "summary.csv", summary.to_csv(index=False).encode())
        log.info("results in %s\n%s", out_dir, results.format_table(summary))
    return summary


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


def _evaluate(cfg: DictConfig, decoder: str, sample_set: SampleSet, out_dir: Path,
              verdicts: dict[tuple[str, str], pd.DataFrame]) -> pd.DataFrame:
    """Summary rows of every evaluator on one decoder's samples; per-image results are written to
    per_sample/<decoder>/<evaluator>.csv and kept in `verdicts`."""
    frames = []
    for ev in _evaluators(cfg):
        res = ev.evaluate(sample_set)
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
    return pd.concat(frames, ignore_index=True)


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
