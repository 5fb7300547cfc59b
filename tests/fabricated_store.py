"""A fabricated results store for the tables, figures and report tests: summary.csv files laid out
as `python -m harness` writes them (results/<experiment>/<time>[/<job>]), and optionally SampleSets.

Two models (tar_1.5b_512, which the paper reports, and shapes, which it does not), three methods
(raster, lantern, mulo_sd) in experiment `main`, and two ablations: ablation_pooling (a k x tau
sweep of mulo_sd jobs plus a separate raster job) and ablation_local (named mulo_* decoders).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from harness.api import Prompt
from harness.store.samples import SampleSet, plan

K = "decoder.mulo_sd.accept.k"
TAU = "decoder.mulo_sd.accept.tau"
COLUMNS = ("experiment", "model", "decoder", "dataset", "evaluator", "evaluator_version", K, TAU,
           "metric", "subset", "value", "stderr", "n", "higher_is_better")
HIGHER = {"latency_s": False, "fid": False}


def row(experiment: str, model: str, decoder: str, metric: str, value: float, subset: str = "all",
        k: int | None = None, tau: float | None = None, dataset: str = "coco") -> dict:
    """One summary.csv row (speed metrics from evaluator speed, quality from its namesake)."""
    evaluator = "speed" if metric in {"latency_s", "acceptance_rate", "speedup_vs_raster", "step_compression"} \
        else metric
    return {"experiment": experiment, "model": model, "decoder": decoder, "dataset": dataset, "evaluator": evaluator,
            "evaluator_version": "1", K: k, TAU: tau, "metric": metric, "subset": subset, "value": value,
            "stderr": None, "n": 8, "higher_is_better": HIGHER.get(metric, True)}


def write_summary(run_dir: Path, rows: list[dict], swept: bool = False) -> Path:
    """Write rows as <run_dir>/summary.csv (swept columns only when `swept`) and a run.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    columns = [c for c in COLUMNS if swept or c not in (K, TAU)]
    lines = [",".join(columns)]
    for r in rows:
        lines.append(",".join("" if r[c] is None else str(r[c]) for c in columns))
    (run_dir / "summary.csv").write_text("\n".join(lines) + "\n")
    (run_dir / "run.json").write_text(json.dumps({"config": {"samples_dir": None},
                                                  "extra": {"summary_rows": len(rows)}}))
    return run_dir


def main_rows(model: str, latency: dict[str, float], geneval: dict[str, float], fid: dict[str, float]) -> list[dict]:
    """An experiment-main job: latency, the speed-up run.py adds, GenEval (fraction) and FID."""
    rows = []
    for decoder, seconds in latency.items():
        rows += [row("main", model, decoder, "latency_s", seconds),
                 row("main", model, decoder, "speedup_vs_raster", latency["raster"] / seconds)]
        if decoder in geneval:
            rows.append(row("main", model, decoder, "geneval", geneval[decoder]))
            rows.append(row("main", model, decoder, "geneval", geneval[decoder] - 0.1, subset="colors"))
        if decoder in fid:
            rows.append(row("main", model, decoder, "fid", fid[decoder]))
    return rows


def build_store(root: Path) -> Path:
    """Write the fabricated store under root/results and return that folder."""
    results = root / "results"
    write_summary(results / "main" / "2026-01-01_10-00-00", main_rows(
        "tar_1.5b_512", {"raster": 10.0, "lantern": 8.0, "mulo_sd": 5.0},
        {"raster": 0.77, "lantern": 0.75, "mulo_sd": 0.7655}, {"raster": 31.0, "lantern": 32.0}))
    write_summary(results / "main" / "2026-01-02_09-00-00", main_rows(
        "shapes", {"raster": 2.0, "lantern": 1.6, "mulo_sd": 0.8},
        {"raster": 0.9, "lantern": 0.88, "mulo_sd": 0.85}, {}))
    sweep = results / "ablation_pooling" / "2026-01-03_08-00-00"
    jobs = [(1, 0.1, 0.5, 0.40, 0.80), (16, 0.1, 0.4, 0.60, 0.82), (1, 0.2, 0.8, 0.25, 0.86), (16, 0.2, 0.6, 0.45, 0.87)]
    for number, (k, tau, latency, acceptance, geneval) in enumerate(jobs):
        write_summary(sweep / str(number), [
            row("ablation_pooling", "shapes", "mulo_sd", "latency_s", latency, k=k, tau=tau),
            row("ablation_pooling", "shapes", "mulo_sd", "acceptance_rate", acceptance, k=k, tau=tau),
            row("ablation_pooling", "shapes", "mulo_sd", "geneval", geneval, k=k, tau=tau)], swept=True)
    write_summary(sweep / "raster", [row("ablation_pooling", "shapes", "raster", "latency_s", 2.0)], swept=True)
    local = []
    for decoder, latency, acceptance, geneval in [("raster", 2.0, None, 0.9), ("mulo_l3", 1.0, 0.7, 0.86),
                                                   ("mulo_raster_scope", 1.6, 0.2, 0.84), ("mulo_l0", 1.25, 0.5, 0.8)]:
        local += [row("ablation_local", "shapes", decoder, "latency_s", latency),
                  row("ablation_local", "shapes", decoder, "speedup_vs_raster", 2.0 / latency),
                  row("ablation_local", "shapes", decoder, "geneval", geneval)]
        if acceptance is not None:
            local.append(row("ablation_local", "shapes", decoder, "acceptance_rate", acceptance))
    write_summary(results / "ablation_local" / "2026-01-04_07-00-00", local)
    return results


def field_rows(dataset: str, latency: dict[str, float], steps: dict[str, float],
               quality: dict[str, dict[str, float]]) -> list[dict]:
    """An experiment-field job on llamagen_xl_512 under one protocol (`dataset`): latency, the
    speed-up run.py adds, step compression, and per decoder its quality metrics ({metric: value})."""
    rows = []
    for decoder, seconds in latency.items():
        rows += [row("field", "llamagen_xl_512", decoder, "latency_s", seconds, dataset=dataset),
                 row("field", "llamagen_xl_512", decoder, "speedup_vs_raster", latency["raster"] / seconds,
                     dataset=dataset),
                 row("field", "llamagen_xl_512", decoder, "step_compression", steps[decoder], dataset=dataset)]
        rows += [row("field", "llamagen_xl_512", decoder, metric, value, dataset=dataset)
                 for metric, value in quality.get(decoder, {}).items()]
    return rows


def build_field_store(root: Path) -> Path:
    """Experiment field on llamagen_xl_512 under its three protocols (COCO 2017, PartiPrompts,
    GenEval), each a run of its own; return the results folder."""
    results = root / "results"
    write_summary(results / "field" / "2026-02-01_10-00-00", field_rows(
        "coco5k", {"raster": 20.0, "sjd": 10.0, "sjd_pac": 5.0, "mulo_sd": 8.0},
        {"raster": 1.0, "sjd": 2.2, "sjd_pac": 4.5, "mulo_sd": 3.0},
        {"raster": {"fid": 30.5, "clip_score": 31.2}, "sjd": {"fid": 30.9, "clip_score": 31.1},
         "sjd_pac": {"fid": 30.7, "clip_score": 31.3}, "mulo_sd": {"fid": 31.8, "clip_score": 30.9}}))
    write_summary(results / "field" / "2026-02-02_10-00-00", field_rows(
        "parti", {"raster": 20.0, "sjd_pac": 4.0}, {"raster": 1.0, "sjd_pac": 4.6},
        {"raster": {"clip_score": 32.0}, "sjd_pac": {"clip_score": 32.1}}))
    write_summary(results / "field" / "2026-02-03_10-00-00", field_rows(  # batched quality run: other speeds
        "geneval", {"raster": 2.0, "mulo_sd": 1.9}, {"raster": 1.0, "mulo_sd": 1.5},
        {"raster": {"geneval": 0.36}, "mulo_sd": {"geneval": 0.35}}))
    return results


def add_samples(run_dir: Path, decoders: list[str], prompts: int = 3, grid: int = 4) -> None:
    """SampleSets <run_dir>/samples/<decoder> with the same prompts and seeds; drafting decoders
    (all but raster) record a rejection map on a grid x grid token grid."""
    specs = plan([Prompt(id=f"p/{i}", text=f"a photo of {i} red squares") for i in range(prompts)], 1, 0)
    rng = np.random.default_rng(0)
    for decoder in decoders:
        samples = SampleSet(run_dir / "samples" / decoder)
        for spec in specs:
            image = rng.integers(0, 255, size=(16, 16, 3), dtype=np.uint8)
            rejections = "" if decoder == "raster" else " ".join(str(v) for v in rng.integers(0, 3, grid * grid))
            samples.write(spec, image, {"target_forwards": 4, "tokens": grid * grid, "batch_id": 0,
                                        "batch_latency_s": 0.1, "rejection_map": rejections})
